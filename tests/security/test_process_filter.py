"""The system-call allowlist alone (`seccomp_filter.py`, installed as the sandbox installs it,
with no namespace and no audit hook): what a program needs works, everything else fails, and a
run is one process whatever it calls."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import avalon
from avalon.org import seccomp_filter

BOOT = Path(avalon.__file__).resolve().parent / "org" / "sandbox_boot.py"


def filtered(cwd: Path, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a child after only `install_filter` (no hook, no namespace)."""
    program = seccomp_filter.program_bytes(os.uname().machine).hex()
    prelude = (f"import ctypes, errno, os, sys\nns = {{'__name__': 'probe'}}\n"
               f"exec(open({str(BOOT)!r}).read(), ns)\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               f"ns['install_filter'](libc, bytes.fromhex({program!r}))\n")
    return subprocess.run([sys.executable, "-I", "-B", "-c", prelude + code], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_no_process_can_be_made_but_threads_pipes_and_files_work(tmp_path):
    code = """
import json, socket, subprocess, threading
out = {}
for name, call in [("fork", os.fork), ("execv", lambda: os.execv("/bin/true", ["true"])),
                   ("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {})),
                   ("subprocess", lambda: subprocess.run(["/bin/true"])),
                   ("memfd", lambda: os.memfd_create("x")),
                   ("inet socket", lambda: socket.socket()),
                   ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
                   ("sched_setaffinity", lambda: os.sched_setaffinity(0, {0})),
                   ("unshare", lambda: libc.unshare(0x40000000) == 0 or
                    (_ for _ in ()).throw(OSError(ctypes.get_errno(), "unshare")))]:
    try:
        call()
        out[name] = "allowed"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
box = []
t = threading.Thread(target=lambda: box.append(sum(range(10))))
t.start()
t.join()
out["thread"] = box
r, w = os.pipe()
os.write(w, b"ok")
out["pipe"] = os.read(r, 2).decode()
a, b = socket.socketpair()
a.sendall(b"hi")
out["socketpair"] = b.recv(2).decode()
open("f.txt", "w").write("x")
out["file"] = open("f.txt").read()
print(json.dumps(out, sort_keys=True))
"""
    r = filtered(tmp_path, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        '{"execv": "EPERM", "file": "x", "fork": "EPERM", "inet socket": "EPERM", '
        '"memfd": "EPERM", "pipe": "ok", "posix_spawn": "EPERM", "sched_setaffinity": "EPERM", '
        '"setpriority": "EPERM", "socketpair": "hi", "subprocess": "EPERM", "thread": [45], '
        '"unshare": "EPERM"}')


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86-64")
def test_raw_calls_of_the_attacks_are_refused(tmp_path):
    # What native code (or ctypes, once the audit hook is out of the way) would call.
    calls = {"clone(SIGCHLD)": (56, 17, 0, 0, 0, 0), "clone3": (435, 0, 0),
             "syslog(READ_ALL)": (103, 3, 0, 0), "io_uring_setup": (425, 4, 0),
             "userfaultfd": (323, 0), "bpf": (321, 0, 0, 0), "perf_event_open": (298, 0, 0, 0,
                                                                                  0, 0),
             "ptrace(ATTACH, 1)": (101, 16, 1, 0, 0), "clock_settime": (227, 0, 0),
             "sethostname": (170, 0, 0), "getpriority(1)": (140, 0, 1),
             "F_SETPIPE_SZ": (72, 0, 1031, 1 << 20), "TIOCSTI": (16, 0, 0x5412, 0),
             "mount": (165, 0, 0, 0, 0, 0), "keyctl": (250, 0, 0, 0, 0, 0)}
    code = ("libc.syscall.restype = ctypes.c_long\nimport json\nout = {}\n"
            f"for name, args in {calls!r}.items():\n"
            "    rc = libc.syscall(*[ctypes.c_long(a) for a in args])\n"
            "    out[name] = 'ran' if rc >= 0 else errno.errorcode[ctypes.get_errno()]\n"
            "print(json.dumps(out))")
    r = filtered(tmp_path, code)
    assert r.returncode == 0, r.stderr
    import json
    out = json.loads(r.stdout)
    assert out == {name: "ENOSYS" if name == "clone3" else "EPERM" for name in calls}, out


def test_a_call_of_another_abi_kills_the_process(tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("x32 is an x86-64 ABI")
    r = filtered(tmp_path, "libc.syscall(0x40000000 | 39)\nprint('survived')")
    assert r.returncode == -31 and "survived" not in r.stdout  # SIGSYS


def test_an_unknown_architecture_is_refused_not_run_unconfined():
    with pytest.raises(seccomp_filter.UnsupportedArchitecture, match="no system-call filter"):
        seccomp_filter.program("sparc")


def test_every_jump_fits_and_every_path_returns():
    for machine in seccomp_filter.TABLES:
        rows = seccomp_filter.program(machine)
        assert len(rows) < 4096
        for i, (code, jt, jf, _) in enumerate(rows):
            assert 0 <= jt < 256 and 0 <= jf < 256
            if code != seccomp_filter.BPF_RET_K:
                assert i + 1 + max(jt, jf) < len(rows)
        assert rows[-1] == seccomp_filter._ret(seccomp_filter.SECCOMP_RET_ERRNO | 1)
