"""Red-team attacks: the trusted code beside the sandbox (its supervisor, the copy-back into the
real workspace) and what every sandbox shares with the others running at the same time (the
read-only files bound into each, the host's Python packages).

BLOCKED: the attack had no effect: the run ended as the program's own (its output returned, no
"sandbox failed"), the workspace took the run's files whole, nothing crossed between sandboxes,
no package of the host was there to read. CRASH: the supervisor died or was limited into
failing, it held more memory than its cap, the copy-back raised half-way (old files gone, new
ones not written, the output lost), a bit crossed between two sandboxes, or a host package was
readable inside.
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from pathlib import Path

from avalon.org import sandbox
from avalon.org.errors import ToolError
from avalon.org.workspace import Workspace, WorkspaceLimits
from experiments.security.outcome import Attack, Outcome

B, C = Outcome.BLOCKED, Outcome.CRASH


def _workspace(tmp: str, name: str = "ws", **limits) -> Workspace:
    return Workspace(Path(tmp) / name, WorkspaceLimits(**{"run_timeout_s": 10.0, **limits}))


def _run(ws: Workspace, code: str, name: str = "attack.py"):
    ws.write(name, textwrap.dedent(code))
    return ws.run_python(name)


def _not_its_own(r) -> str:
    """Why a run did not end as the program's own ("" when it did)."""
    if "(sandbox failed" in r.stderr:
        return r.stderr.strip().splitlines()[-1][:140]
    if r.returncode is None:
        return "no exit status"
    return ""


def signal_the_supervisor(tmp: str) -> tuple[Outcome, str]:
    """SIGINT to PID 1 (the supervisor: Python's SIGINT handler is the one signal a namespace's
    PID 1 takes from inside) and to the process group, then SIGTERM and SIGKILL to every pid
    the program can name: each run must end as the program's own, output and files kept. (A
    trainer started with SIGINT ignored, as a non-interactive shell starts a background job,
    passes that on to the supervisor, which then ignored the program's SIGINT even before: run
    this one in the foreground to see the old supervisor fall.)"""
    ws = _workspace(tmp)
    programs = {
        "pid 1": "os.kill(1, signal.SIGINT)",
        "the process group": "os.kill(0, signal.SIGINT)",
        "every pid": "for p in range(1, 64):\n    for s in (signal.SIGINT, signal.SIGTERM, "
                     "signal.SIGKILL):\n        try:\n            os.kill(p, s) if p != "
                     "os.getpid() else None\n        except OSError:\n            pass",
    }
    broken = []
    for what, attack in programs.items():
        r = _run(ws, "import os, signal, time\nprint('BEFORE', flush=True)\n"
                     "open('mark.txt', 'w').write('kept')\ntry:\n"
                     + textwrap.indent(attack, "    ") + "\n    time.sleep(0.3)\n"
                     "except KeyboardInterrupt:\n    pass\nprint('AFTER')\n")
        why = _not_its_own(r)
        if why or "BEFORE" not in r.stdout or not ws.exists("mark.txt"):
            broken.append(f"{what}: {why or 'output or files lost'}")
        if ws.exists("mark.txt"):
            ws.remove("mark.txt")
    if broken:
        return C, "; ".join(broken)
    return B, f"{len(programs)} runs ended as the program's own (output and files kept)"


def relimit_the_supervisor(tmp: str) -> tuple[Outcome, str]:
    """`prlimit` on PID 1 (same uid as the supervisor): 1 MiB of address space, 3 open files,
    then the program writes a file: the run must return its output and its file."""
    ws = _workspace(tmp)
    broken = []
    for what, limit in (("address space", "resource.RLIMIT_AS, (1 << 20, 1 << 20)"),
                        ("open files", "resource.RLIMIT_NOFILE, (3, 3)"),
                        ("file size", "resource.RLIMIT_FSIZE, (0, 0)")):
        r = _run(ws, f"""
            import os, resource
            try:
                resource.prlimit(1, {limit})
                print('LIMITED')
            except OSError as e:
                print('REFUSED', e)
            os.makedirs('d', exist_ok=True)
            open('d/out.txt', 'w').write('{what}')
            print('AFTER')
            """)
        why = _not_its_own(r)
        if why or "AFTER" not in r.stdout or not ws.exists("d/out.txt"):
            broken.append(f"{what}: {why or 'output or file lost'}")
    if broken:
        return C, "; ".join(broken)
    return B, "3 runs returned their output and files (the supervisor's limits untouched)"


def _descendants() -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _supervisor_peak(stop: threading.Event, peak: list[int]) -> None:
    """Records the highest VmHWM (bytes) of this process's sandbox supervisors (a child of
    bubblewrap running `supervise`) until `stop`."""
    while not stop.is_set():
        for pid in _descendants():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{ppid}/cmdline", "rb") as f:
                    parent = os.path.basename(f.read().split(b"\0")[0])
                with open(f"/proc/{pid}/status") as f:
                    hwm = [line for line in f if line.startswith("VmHWM:")]
            except (OSError, ValueError, IndexError):
                continue
            if b"supervise" in cmd and parent == b"bwrap" and hwm:
                peak[0] = max(peak[0], int(hwm[0].split()[1]) << 10)
        time.sleep(0.002)


def hard_links_read_back(tmp: str) -> tuple[Outcome, str]:
    """15 files of 1 MiB, each hard-linked 32 times (495 names, 15 MiB on the workspace's
    tmpfs): reading every name back, the old supervisor held 495 MiB, twice the run's 256 MiB,
    before its byte cap applied. Its peak must stay within its own cap."""
    if not sandbox.layers().bubblewrap:
        return B, "not run: no bubblewrap here (no supervisor)"
    lim = dict(run_memory_mb=256)
    ws = _workspace(tmp, **lim)
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_supervisor_peak, args=(stop, peak), daemon=True)
    watcher.start()
    try:
        r = _run(ws, """
            import os
            for i in range(15):
                open(f'f{i}', 'wb').write(b'x' * (1 << 20))
            for j in range(32):
                for i in range(15):
                    os.link(f'f{i}', f'l{i}_{j}')
            print('NAMES', len(os.listdir('.')))
            """)
    finally:
        stop.set()
        watcher.join()
    limits = WorkspaceLimits(**lim)
    cap_of = getattr(sandbox, "supervisor_memory_bytes", None)
    cap = cap_of(limits) if cap_of else limits.run_memory_mb << 20  # (none before: the run's)
    detail = (f"{r.stdout.split()[-1] if r.stdout.split() else '?'} names; supervisor peak "
              f"{peak[0] >> 20} MiB, its cap {cap >> 20} MiB; the run: "
              f"{r.caps_broken or _not_its_own(r) or 'within the caps'}")
    if not peak[0]:
        return C, "the supervisor was never seen: " + detail
    if peak[0] > cap or _not_its_own(r) or not r.caps_broken:
        return C, detail
    return B, detail


def copy_back_bad_name(tmp: str) -> tuple[Outcome, str]:
    """The program renames `old.txt` to `new.txt` and makes a file named ' ' (a name the old
    copy-back's first check took and the file tools refuse): the old copy-back pruned
    `old.txt`, then raised on ' ' before writing `new.txt`, and the output was lost."""
    ws = _workspace(tmp)
    ws.write("old.txt", "precious")
    try:
        r = _run(ws, """
            import os
            os.rename('old.txt', 'new.txt')
            open(' ', 'w').write('blank')
            open('  ', 'w').write('blank')
            print('OUTPUT')
            """)
    except ToolError as e:
        state = f"old.txt {'kept' if ws.exists('old.txt') else 'gone'}, new.txt " \
            f"{'written' if ws.exists('new.txt') else 'not written'}"
        return C, f"the copy-back raised ({e}): {state}, the output lost"
    if "OUTPUT" not in r.stdout or ws.exists("old.txt") or not ws.exists("new.txt") \
            or ws.read("new.txt") != "precious":
        return C, f"the workspace did not take the run whole: {ws.listdir()}"
    return B, f"applied whole, the blank names left behind: {ws.listdir()}"


def copy_back_order(tmp: str) -> tuple[Outcome, str]:
    """A workspace of 15 files of 1 MiB; the program empties 8 and writes 8 new ones of 1 MiB
    (15 MiB in the end, under the 16 MiB cap). The old copy-back wrote the new files first,
    each checked against the workspace as it stood, and refused one half-way."""
    ws = _workspace(tmp)
    for i in range(15):
        ws.write_bytes(f"f{i:02d}", b"x" * (1 << 20))
    try:
        r = _run(ws, """
            for i in range(8):
                open(f'f{i:02d}', 'wb').close()
            for i in range(8):
                open(f'g{i:02d}', 'wb').write(b'y' * (1 << 20))
            print('OUTPUT')
            """)
    except ToolError as e:
        made = sum(ws.exists(f"g{i:02d}") for i in range(8))
        emptied = sum(ws.size(f"f{i:02d}") == 0 for i in range(8))
        return C, f"the copy-back raised ({e}) after {made} of 8 new files, {emptied} of 8 " \
            "emptied: the output lost"
    sizes = [ws.size(f"g{i:02d}") for i in range(8)] + [ws.size(f"f{i:02d}") for i in range(8)]
    if "OUTPUT" not in r.stdout or sizes != [1 << 20] * 8 + [0] * 8:
        return C, f"the workspace did not take the run whole: {r.caps_broken or sizes}"
    return B, "applied whole: 8 files emptied, 8 written"


LOCK_SENDER = """
import fcntl, os, struct, sys, time
held = []
for path in {paths!r}:
    try:
        f = open(path, 'r+b' if path.startswith('/dev/') else 'rb')
    except OSError:
        continue
    fcntl.flock(f, fcntl.LOCK_EX)
    fcntl.lockf(f, fcntl.LOCK_EX if f.writable() else fcntl.LOCK_SH)
    held.append(f)
print('HELD', len(held), flush=True)
deadline = time.monotonic() + {hold_s}
while time.monotonic() < deadline:  # and read the shared directory, for F_NOTIFY
    try:
        names = os.listdir({watched!r})
    except OSError:
        names = []
    for name in names:
        try:
            open(os.path.join({watched!r}, name), 'rb').close()
        except OSError:
            pass
    time.sleep(0.01)
"""

LOCK_RECEIVER = """
import fcntl, os, signal, struct, sys, time, json
seen = {{}}
notes = []
signal.signal(signal.SIGIO, lambda *a: notes.append(1))
try:
    d = os.open({watched!r}, os.O_RDONLY)
    fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
    seen['F_NOTIFY'] = 'set'
except OSError as e:
    seen['F_NOTIFY'] = 'refused: %s' % e
files = []
for path in {paths!r}:
    try:
        files.append((path, open(path, 'r+b' if path.startswith('/dev/') else 'rb')))
    except OSError:
        pass
deadline = time.monotonic() + {probe_s}
while time.monotonic() < deadline and not any(v == 'LOCKED BY ANOTHER' for v in seen.values()):
    for path, f in files:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
        except BlockingIOError:
            seen['flock ' + path] = 'LOCKED BY ANOTHER'
        query = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0)
        try:
            got = struct.unpack('hhqqi', fcntl.fcntl(f, fcntl.F_GETLK, query))
            if got[0] != fcntl.F_UNLCK:
                seen['F_GETLK ' + path] = 'LOCKED BY ANOTHER'
        except OSError:
            pass
    time.sleep(0.02)
if notes:
    seen['F_NOTIFY'] = 'LOCKED BY ANOTHER'  # another sandbox's reads reached this one
print('REPORT ' + json.dumps(seen))
"""


def shared_file_locks(tmp: str) -> tuple[Outcome, str]:
    """Two sandboxes of two organisations run at once. One takes `flock` and `fcntl` locks on
    the files every sandbox binds (the interpreter, /etc/ld.so.cache, /dev/null) and reads a
    shared directory; the other probes those locks and watches the directory (`F_NOTIFY`): any
    lock or notification it sees is a bit carried between them."""
    if not sandbox.layers().bubblewrap:
        return B, "not run: no bubblewrap here (the program runs on the host)"
    exe, _ = sandbox._interpreter()
    paths = [exe, "/etc/ld.so.cache", "/dev/null"]
    watched = os.path.dirname(os.path.realpath(json.__file__))  # the standard library's
    sender = _workspace(tmp, "sender", run_timeout_s=20.0)
    receiver = _workspace(tmp, "receiver", run_timeout_s=20.0)
    sent: dict = {}

    def send():
        sent["r"] = _run(sender, LOCK_SENDER.format(paths=paths, hold_s=9.0, watched=watched))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    time.sleep(1.5)  # the sender's sandbox starts and takes its locks
    r = _run(receiver, LOCK_RECEIVER.format(paths=paths, probe_s=6.0, watched=watched))
    thread.join(30)
    report = next((json.loads(line[7:]) for line in r.stdout.splitlines()
                   if line.startswith("REPORT ")), None)
    held = sent.get("r")
    if report is None or held is None or "HELD" not in held.stdout:
        return C, f"a program failed: {(r.stderr or getattr(held, 'stderr', '')).strip()[-150:]}"
    crossed = sorted(k for k, v in report.items() if v == "LOCKED BY ANOTHER")
    if crossed:
        return C, f"seen from the other sandbox: {', '.join(crossed)}"
    return B, f"nothing crossed ({held.stdout.split()[1]} files locked by the sender; " \
        f"F_NOTIFY {report.get('F_NOTIFY', '?')[:40]})"


def host_packages(tmp: str) -> tuple[Outcome, str]:
    """The program walks the sandbox's whole file system for Python packages (a `site-packages`
    or `dist-packages` with anything in it, any `.py` file outside the standard library and
    the workspace) and imports the first package it finds."""
    r = _run(_workspace(tmp), """
        import json, os, sys
        stdlib = os.path.dirname(os.__file__)
        found, extra, imported = [], [], None
        for root, dirs, files in os.walk('/'):
            if root == '/ws' or root.startswith(('/ws/', '/proc', '/dev')):
                dirs[:] = []
                continue
            for d in [d for d in dirs if d in ('site-packages', 'dist-packages')]:
                path = os.path.join(root, d)
                try:
                    names = os.listdir(path)
                except OSError:
                    names = []
                if names:
                    found.append(path)
                dirs.remove(d)  # found: its thousands of files need no walk
            if not (root == stdlib or root.startswith(stdlib + '/')):
                extra += [os.path.join(root, f) for f in files if f.endswith('.py')]
        # Said before any import: importing a large package may outlast the run's time.
        print('REPORT ' + json.dumps({'found': found[:5], 'n': len(found), 'py': extra[:3],
                                      'n_py': len(extra)}), flush=True)
        for path in found:
            sys.path.append(path)
            for name in sorted(os.listdir(path)):
                if name.isidentifier() and name not in sys.modules:
                    try:
                        __import__(name)
                        imported = name
                        break
                    except BaseException:
                        pass
            if imported:
                print('IMPORTED ' + imported, flush=True)
                break
        """)
    lines = r.stdout.splitlines()
    report = next((json.loads(line[7:]) for line in lines if line.startswith("REPORT ")), None)
    imported = next((line[9:] for line in lines if line.startswith("IMPORTED ")), None)
    if report is None:
        why = "timed out" if r.timed_out else r.stderr.strip()[-150:]
        return C, f"the program failed: {why}"
    if report["n"] or report["n_py"] or imported:
        return C, (f"{report['n']} package directories ({', '.join(report['found'][:2])}), "
                   f"{report['n_py']} .py files outside the standard library; imported "
                   f"{imported or 'none in the run time'}")
    return B, "no package directory and no Python file outside the standard library"


ATTACKS = [
    Attack("supervisor: SIGINT to PID 1, to the process group, kill every pid",
           signal_the_supervisor),
    Attack("supervisor: prlimit on PID 1 (memory, files, file size)", relimit_the_supervisor),
    Attack("supervisor: reading back 495 hard links to 1 MiB files", hard_links_read_back),
    Attack("copy-back: a blank file name after a rename", copy_back_bad_name),
    Attack("copy-back: 8 files emptied and 8 written at the byte cap", copy_back_order),
    Attack("sandboxes: locks and F_NOTIFY on the files every sandbox binds",
           shared_file_locks),
    Attack("sandbox: the host's Python packages, found and imported", host_packages),
]
