"""Red-team attacks: the sandbox as a boundary in the kernel. Each program runs through
`Workspace.run_python` and reports what it got; the attack reads the report.

CRASH: the attack worked (a system call reached the kernel past the filter, a process outside
the sandbox was touched, memory, disk, inodes or threads beyond the limits were held, an honest
program died of its output). BLOCKED: it had no effect. An attack whose program failed for a
reason of its own is a CRASH with the reason, so a broken attack never reads as blocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

from avalon.org.workspace import Workspace, WorkspaceLimits
from experiments.security.outcome import Attack, Outcome

B, C = Outcome.BLOCKED, Outcome.CRASH

# Switches the old audit hook off with pure Python (no `import ctypes`, which the hook refused):
# `_ctypes.pointer(x)[i]` reads and writes memory at any offset from `x` without an audit event;
# through the frames, the boot module's refused-event set is reachable, and overwriting the
# first character of each of its strings (the very objects the hook's sets hold) makes every
# refused event unknown to the hook. Under a kernel boundary `import ctypes` simply works.
UNHOOK = '''
import json, os, sys
def unhook():
    try:
        import ctypes
        ctypes.CDLL(None)  # (the old boot had imported ctypes itself: loading is what it refused)
        return "not needed"
    except PermissionError:
        pass
    import _ctypes
    class c_char(_ctypes._SimpleCData):
        _type_ = "c"
    anchor = c_char(b"x")
    base, poke = _ctypes.addressof(anchor), _ctypes.pointer(anchor)
    f = sys._getframe()
    while f.f_back:
        f = f.f_back
    data = sys.getsizeof("") - 1  # where a compact ASCII str keeps its characters
    hit = 0
    for name in ("REFUSED", "REFUSED_MODULES"):
        for s in f.f_globals.get(name, ()):
            poke[id(s) + data - base] = b"#"
            hit += 1
    import ctypes
    return f"switched off ({hit} refused names overwritten)"
how = unhook()
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def reached(rc):
    """A call got past the filter: it succeeded, or the kernel itself answered (EINVAL,
    EFAULT, ...), not the filter's EPERM/ENOSYS."""
    return rc >= 0 or ctypes.get_errno() not in (1, 38)
'''


def _run(tmp: str, code: str, **limits) -> tuple[Workspace, object, dict | None]:
    ws = Workspace(Path(tmp) / "ws", WorkspaceLimits(**{"run_timeout_s": 10.0, **limits}))
    ws.write("attack.py", UNHOOK + textwrap.dedent(code))
    r = ws.run_python("attack.py")
    report = None
    for line in r.stdout.splitlines():
        if line.startswith("REPORT "):
            report = json.loads(line[7:])
    return ws, r, report


def _failed(r) -> str:
    tail = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return f"attack program failed: {tail[:150]}"


def raw_syscalls(tmp: str) -> tuple[Outcome, str]:
    """The hook switched off, then the calls the issue names, by number (x86-64)."""
    if os.uname().machine != "x86_64":
        return B, "not run: syscall numbers of x86-64"
    _, r, report = _run(tmp, """
        params = ctypes.create_string_buffer(120)
        calls = {"syslog": (103, 10, 0, 0), "io_uring_setup": (425, 4, ctypes.addressof(params)),
                 "userfaultfd": (323, 0), "bpf": (321, 0, 0, 0),
                 "perf_event_open": (298, 0, 0, -1, -1, 0)}
        got = {}
        for name, args in calls.items():
            rc = libc.syscall(*[ctypes.c_long(a) for a in args])
            got[name] = "reached" if reached(rc) else "refused"
        print("REPORT " + json.dumps({"how": how, "calls": got}))
        """)
    if report is None:
        return C, _failed(r)
    ran = [n for n, v in report["calls"].items() if v == "reached"]
    if ran:
        return C, f"hook {report['how']}; reached the kernel: {', '.join(ran)}"
    return B, f"hook {report['how']}; all 5 refused by the filter"


def machine_changes(tmp: str) -> tuple[Outcome, str]:
    """The trainer's process and the host, from inside: renice and pin the trainer (to the
    values it has: no change), put another process of the machine (a `sleep` the attack
    starts) under SCHED_IDLE, set the host name and clock (the same name, an invalid time: no
    change), count the pids that answer getpriority, and see the sandbox's uid and
    capabilities."""
    trainer = os.getpid()
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _, r, report = _machine_changes(tmp, trainer, victim.pid)
        idle = os.sched_getscheduler(victim.pid) == os.SCHED_IDLE
    finally:
        victim.kill()
        victim.wait()
    if report is None:
        return C, _failed(r)
    got = report["got"]
    worked = [k for k in ("renice the trainer", "pin the trainer", "set the host name",
                          "set the clock", "see the trainer") if got[k]]
    if got["idle another process"] or idle:
        worked.append("put another process under SCHED_IDLE")
    if got["capabilities"]:
        worked.append("holds capabilities")
    if got["uid"] == 0:
        worked.append("runs as uid 0")
    if got["pids seen"] > 2:
        worked.append(f"{got['pids seen']} pids seen")
    detail = (f"hook {report['how']}; uid {got['uid']}, capabilities {got['capabilities']}, "
              f"pids seen {got['pids seen']}")
    return (C, "worked: " + ", ".join(worked) + f" ({detail})") if worked else (B, detail)


def _machine_changes(tmp: str, trainer: int, victim: int):
    return _run(tmp, f"""
        got = {{}}
        libc.getpriority.restype = ctypes.c_int
        ctypes.set_errno(0)
        nice = libc.getpriority(0, {trainer})
        got["see the trainer"] = ctypes.get_errno() == 0
        got["renice the trainer"] = got["see the trainer"] and \\
            libc.setpriority(0, {trainer}, nice) == 0
        mask = ctypes.create_string_buffer(128)
        got["pin the trainer"] = libc.sched_getaffinity({trainer}, 128, mask) >= 0 and \\
            libc.sched_setaffinity({trainer}, 128, mask) == 0
        param = ctypes.c_int(0)
        got["idle another process"] = \\
            libc.sched_setscheduler({victim}, 5, ctypes.byref(param)) == 0  # SCHED_IDLE
        name = ctypes.create_string_buffer(256)
        libc.gethostname(name, 256)
        got["set the host name"] = libc.sethostname(name, len(name.value)) == 0
        ts = (ctypes.c_long * 2)(0, 2_000_000_000)  # invalid nanoseconds: never applied
        got["set the clock"] = reached(libc.syscall(227, 0, ts))
        seen = 0
        for pid in range(1, 4096):
            ctypes.set_errno(0)
            libc.getpriority(0, pid)
            seen += ctypes.get_errno() == 0
        got["pids seen"] = seen
        hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
        caps = (ctypes.c_uint32 * 6)()
        libc.capget(hdr, caps)
        got["uid"], got["capabilities"] = os.getuid(), any(caps)
        print("REPORT " + json.dumps({{"how": how, "got": got}}))
        """)


def files_outside(tmp: str) -> tuple[Outcome, str]:
    """The hook switched off, then a file beside the workspace read and overwritten and a new
    one made there (what a program did where Landlock was missing)."""
    secret, planted = Path(tmp) / "outside.txt", Path(tmp) / "planted.txt"
    secret.write_text("the trainer's")
    _, r, report = _run(tmp, f"""
        got = {{}}
        buf = ctypes.create_string_buffer(64)
        for what, path, flags in (("read", {str(secret)!r}, os.O_RDONLY),
                                  ("overwrite", {str(secret)!r}, os.O_WRONLY | os.O_TRUNC),
                                  ("create", {str(planted)!r}, os.O_WRONLY | os.O_CREAT)):
            fd = libc.open(path.encode(), flags, 0o644)  # libc's, not the hooked os.open
            if fd < 0:
                got[what] = "refused: " + os.strerror(ctypes.get_errno())
            elif what == "read":
                n = libc.read(fd, buf, 64)
                got[what] = buf.raw[:max(n, 0)].decode()
            else:
                got[what] = libc.write(fd, b"planted", 7)
        print("REPORT " + json.dumps({{"how": how, "got": got}}))
        """)
    if report is None:
        return C, _failed(r)
    got = report["got"]
    worked = []
    if got["read"] == "the trainer's":
        worked.append("read it")
    if secret.read_text() != "the trainer's":
        worked.append("overwrote it")
    if planted.exists():
        worked.append("made a file beside it")
    detail = f"hook {report['how']}; " + ", ".join(f"{k}: {v}" for k, v in got.items())
    return (C, "worked: " + ", ".join(worked) + f" ({detail})") if worked else (B, detail)


def memfds(tmp: str) -> tuple[Outcome, str]:
    """300 MiB in memfds under a 256 MiB memory limit (the pages are not in the address
    space, so RLIMIT_AS does not see them)."""
    _, r, report = _run(tmp, """
        held, err, fds = 0, "", []
        try:
            for i in range(300):
                fd = os.memfd_create(f"m{i}")
                os.write(fd, b"x" * (1 << 20))
                fds.append(fd)
                held += 1
        except OSError as e:
            err = str(e)
        print("REPORT " + json.dumps({"held_mib": held, "error": err}))
        """, run_memory_mb=256)
    if report is None:
        return C, _failed(r)
    if report["held_mib"] > 256:
        return C, f"{report['held_mib']} MiB held in memfds under a 256 MiB limit"
    return B, f"{report['held_mib']} MiB held; stopped by: {report['error'][:80]}"


def pipe_buffers(tmp: str) -> tuple[Outcome, str]:
    """Pipes enlarged to 1 MiB (F_SETPIPE_SZ) and filled, up to 400 MiB, under 256 MiB."""
    _, r, report = _run(tmp, """
        import fcntl
        held, err, ends = 0, "", []
        try:
            while held < (400 << 20):
                rd, wr = os.pipe()
                ends.append((rd, wr))
                try:
                    fcntl.fcntl(wr, 1031, 1 << 20)  # F_SETPIPE_SZ
                except OSError as e:
                    err = err or f"F_SETPIPE_SZ: {e}"
                os.set_blocking(wr, False)
                try:
                    while True:
                        held += os.write(wr, b"x" * 65536)
                except BlockingIOError:
                    pass
        except OSError as e:
            err = err + f"; {e}"
        print("REPORT " + json.dumps({"held_mib": held >> 20, "error": err}))
        """, run_memory_mb=256)
    if report is None:
        return C, _failed(r)
    if report["held_mib"] > 256:
        return C, f"{report['held_mib']} MiB held in pipe buffers under a 256 MiB limit"
    return B, f"{report['held_mib']} MiB held; stopped by: {report['error'][:100]}"


def unlinked_files(tmp: str) -> tuple[Outcome, str]:
    """Disk and inodes past the caps in files nobody can list: 1 MiB files unlinked while
    open (100 MiB against 16 MiB), and 2,400 O_TMPFILE or unlinked files kept by a one-page
    mapping each (against 512 entries)."""
    _, r, report = _run(tmp, """
        import mmap
        held, kept, err, keep = 0, 0, "", []
        try:
            for i in range(100):
                fd = os.open(f"u{i}", os.O_RDWR | os.O_CREAT)
                os.write(fd, b"x" * (1 << 20))
                os.unlink(f"u{i}")
                keep.append(fd)
                held += 1
        except OSError as e:
            err = f"bytes: {e}"
        for fd in keep:
            os.close(fd)
        try:
            for i in range(2400):
                try:
                    fd = os.open(".", os.O_RDWR | os.O_TMPFILE)
                except OSError:
                    fd = os.open(f"t{i}", os.O_RDWR | os.O_CREAT)
                    os.unlink(f"t{i}")
                os.write(fd, b"y")
                keep.append(mmap.mmap(fd, 1))
                os.close(fd)
                kept += 1
        except OSError as e:
            err += f"; inodes: {e}"
        print("REPORT " + json.dumps({"held_mib": held, "inodes": kept, "error": err}))
        """)
    if report is None:
        return C, _failed(r)
    lim = WorkspaceLimits()
    over = []
    if report["held_mib"] << 20 > 2 * lim.max_total_bytes:
        over.append(f"{report['held_mib']} MiB in unlinked files (cap 16 MiB)")
    if report["inodes"] > 2 * lim.max_files:
        over.append(f"{report['inodes']} unlisted inodes (cap {lim.max_files})")
    detail = (f"{report['held_mib']} MiB and {report['inodes']} inodes held; "
              f"{report['error'][:90]}")
    return (C, "; ".join(over)) if over else (B, detail)


def threads(tmp: str) -> tuple[Outcome, str]:
    """Threads until refused (at most 2,000: enough to show there is no limit)."""
    _, r, report = _run(tmp, """
        import threading
        threading.stack_size(65536)
        stop, made, err = threading.Event(), 0, ""
        try:
            for _ in range(2000):
                threading.Thread(target=stop.wait, daemon=True).start()
                made += 1
        except RuntimeError as e:
            err = str(e)
        stop.set()
        print("REPORT " + json.dumps({"threads": made, "error": err}))
        """)
    if report is None:
        return C, _failed(r)
    cap = getattr(WorkspaceLimits(), "max_threads", 64)  # (the code before had no cap)
    if report["threads"] > 2 * cap:
        return C, f"{report['threads']} threads from one run"
    return B, f"{report['threads']} threads, then: {report['error'][:60]}"


def loud_honest_program(tmp: str) -> tuple[Outcome, str]:
    """An honest program prints 2 MiB: it must finish, its output cut with a marker."""
    ws = Workspace(Path(tmp) / "ws", WorkspaceLimits(run_timeout_s=10.0))
    ws.write("loud.py", "for i in range(20000):\n    print(f'{i:08d} ' + 'x' * 96)\n"
                        "open('done.txt', 'w').write('yes')\n")
    r = ws.run_python("loud.py")
    if r.returncode != 0:
        return C, f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:100]}"
    if not ws.exists("done.txt") or "truncated" not in r.stdout:
        return C, "finished, but its output was not cut with a marker"
    return B, f"exit 0, stdout cut to {len(r.stdout)} characters: " \
        f"{r.stdout.splitlines()[-1][:60]}"


ATTACKS = [
    Attack("kernel: audit hook switched off, then syslog/io_uring/userfaultfd/bpf/perf",
           raw_syscalls),
    Attack("kernel: audit hook switched off, then files outside the workspace", files_outside),
    Attack("kernel: renice, pin, SCHED_IDLE, hostname, clock, pids, uid and capabilities",
           machine_changes),
    Attack("limits: 300 MiB of memfds under 256 MiB", memfds),
    Attack("limits: 400 MiB of pipe buffers under 256 MiB", pipe_buffers),
    Attack("limits: unlinked and O_TMPFILE files past the disk and entry caps", unlinked_files),
    Attack("limits: 2,000 threads", threads),
    Attack("output: an honest program prints 2 MiB", loud_honest_program),
]
