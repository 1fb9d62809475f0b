"""The seccomp layer alone (no audit hook): a run is one process, whatever it calls."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import avalon
from avalon.org.workspace import Workspace, WorkspaceLimits

BOOT = Path(avalon.__file__).resolve().parent / "org" / "sandbox_boot.py"


def filtered(cwd: Path, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a child after only `install_process_filter` (no hook, no Landlock)."""
    prelude = (f"import ctypes, os, sys\nns = {{'__name__': 'probe'}}\n"
               f"exec(open({str(BOOT)!r}).read(), ns)\n"
               "assert ns['install_process_filter'](ctypes.CDLL(None, use_errno=True))\n")
    return subprocess.run([sys.executable, "-I", "-B", "-c", prelude + code], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_no_process_can_be_made_but_threads_work(tmp_path):
    code = """
import errno, subprocess, threading
out = {}
for name, call in [("fork", os.fork), ("execv", lambda: os.execv("/bin/true", ["true"])),
                   ("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {})),
                   ("subprocess", lambda: subprocess.run(["/bin/true"]))]:
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
print(out)
"""
    r = filtered(tmp_path, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str({"fork": "EPERM", "execv": "EPERM", "posix_spawn": "EPERM",
                                    "subprocess": "EPERM", "thread": [45]})


def test_a_raw_clone_without_clone_thread_is_refused(tmp_path):
    # What native code would do: the clone system call itself, flags SIGCHLD only (a fork).
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86-64")
    code = ("libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "r = libc.syscall(56, 17, 0, 0, 0, 0)\n"
            "print('child' if r == 0 else ('parent' if r > 0 else ctypes.get_errno()))\n"
            "print(libc.syscall(435, 0, 0), ctypes.get_errno())")  # clone3: ENOSYS
    r = filtered(tmp_path, code)
    assert r.stdout.split() == ["1", "-1", "38"], r.stderr


def test_an_unknown_architecture_is_refused_not_run_unconfined():
    ns = {"__name__": "probe"}
    exec(BOOT.read_text(), ns)
    with pytest.raises(OSError, match="no process filter for architecture"):
        ns["process_filter"]("sparc")


def test_the_whole_run_dies_at_the_time_limit(tmp_path):
    # Threads are the only concurrency left: they die with the process at the kill.
    ws = Workspace(tmp_path / "ws", WorkspaceLimits(run_timeout_s=1.0))
    ws.write("p.py", "import threading, time\n"
                     "def late():\n    time.sleep(1.5)\n    open('late.txt', 'w').write('x')\n"
                     "threading.Thread(target=late).start()\nwhile True:\n    pass\n")
    r = ws.run_python("p.py")
    assert r.timed_out
    import time
    time.sleep(1.0)
    assert not ws.exists("late.txt")
