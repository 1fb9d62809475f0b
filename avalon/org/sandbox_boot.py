"""The program that runs inside the sandbox (its text is passed with `python -I -B -S -c`; never
imported to run). `avalon/org/sandbox.py` starts it and documents the sandbox as a whole.

argv: MODE CONFIG (a JSON object, `sandbox.py`'s `_config`).

MODE "supervise" (under bubblewrap; this process is PID 1 of the sandbox's PID namespace):
1. `limit_workspace`: remounts the workspace tmpfs with its byte and inode caps (the kernel then
   refuses a file, link, directory, unlinked or O_TMPFILE file past them: ENOSPC), then gives
   it to the sandbox's uid;
2. `unshare(CLONE_NEWPID)`: the agent's process will live in a PID namespace of its own, where
   this supervisor has no pid: the agent runs as the same uid, which could otherwise signal
   it (Python's SIGINT handler ended a run as "sandbox failed") or lower its resource limits
   (`prlimit`), and it cannot name it any more. `hold_namespace` is that namespace's PID 1, a
   process with no signal handler (so nothing from inside reaches it) that only waits to be
   killed; the agent is PID 2, the supervisor's own child, in a session of its own (so
   `kill(0, ...)` reaches only itself);
3. `drop_privileges`: drops every capability (bounding set, ambient, effective, permitted) and
   sets no_new_privs; where the sandbox has a uid of its own (the trainer runs as root), it
   becomes that uid (`uid`, mapped outside to an unprivileged uid that is only the sandbox's);
4. `receive_files`: the workspace's files and directories, from the trainer on stdin;
5. forks the agent's process (`run_agent`): it dies with this one (PR_SET_PDEATHSIG, and with
   its namespace's PID 1), holds no descriptor but stdout and stderr, sets its resource limits
   (address space, CPU seconds, file size, open files, processes/threads of its uid
   (`RLIMIT_NPROC`, which binds: the uid is not root), no core files, no locked memory),
   installs the system-call filter (`seccomp_filter.py`: an allowlist) and the audit hook
   (`install_hook`: clear errors for what the kernel would refuse anyway), and runs the file as
   `__main__`. The supervisor then caps its own address space (`supervisor_memory`, set by the
   trainer from the workspace's caps);
6. waits at most `timeout_s` (then SIGKILL), polling the workspace's inodes where the remount
   failed; measures the workspace (entries, bytes of regular files, depth) against the caps,
   reading no more bytes than the byte cap allows (hard links make one file many names);
7. `send_files` on the status descriptor: the regular files and directories of the workspace
   (nothing when it is over a cap), then the status as JSON.
MODE "direct" (no bubblewrap: `sandbox_guard.py`'s text is prepended): resource limits, the
network namespace, Landlock, the filter and the legacy audit hook, then the file runs in this
process, in the real workspace (the working directory).

Frames (both directions): kind (1 byte: D directory, F file, S status, E end), name length
(4 bytes), data length (8 bytes), big-endian, then the name (bytes, relative to the workspace)
and the data.
"""

import ctypes
import json
import os
import resource
import runpy
import select
import signal
import stat
import struct
import sys
import time

FRAME = struct.Struct(">cIQ")
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
CLONE_NEWPID = 0x20000000
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Events refused with a readable error (the kernel refuses them anyway: no process can start,
# no network exists).
REFUSED_PROCESSES = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn"})
NETWORK_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"})


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def set_limits(limits: dict) -> None:
    """Resource limits of the agent's process, from the config's `limits` (name -> value)."""
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def install_filter(libc, program: bytes) -> None:
    """The seccomp filter (`seccomp_filter.program_bytes`); refuses to go on without it."""
    rows = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    prog = (_SockFilter * len(rows))(*[_SockFilter(*r) for r in rows])
    fprog = _SockFprog(len(rows), ctypes.cast(prog, ctypes.POINTER(_SockFilter)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: cannot install the system-call filter")


def install_hook() -> None:
    """Readable errors for starting processes and reaching a network (the kernel refuses both
    in any case: this is not a boundary). Bound now; looks up no global at call time."""
    deny, refused, network = PermissionError, REFUSED_PROCESSES, NETWORK_EVENTS
    is_a, tuple_, af_unix = isinstance, tuple, 1

    def hook(event, args):
        if event in refused:
            raise deny(f"sandbox: {event} is not allowed: a run is one process, it starts no "
                       "other")
        if (event in network and len(args) > 1 and is_a(args[1], tuple_)) or (
                event == "socket.__new__" and args[1] not in (af_unix, -1)):
            raise deny(f"sandbox: {event} is not allowed: there is no network (local AF_UNIX "
                       "sockets only)")
        if event == "socket.getaddrinfo" or event == "socket.gethostbyname":
            raise deny(f"sandbox: {event} is not allowed: there is no network")

    sys.addaudithook(hook)


def exiter():
    """A function that flushes stdout and stderr and ends the process with a status, all bound
    now (the program can reach and clear this text's globals)."""
    exit_now, streams = os._exit, (sys.stdout, sys.stderr)

    def finish(code: int) -> None:
        for stream in streams:
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a closed or broken stream: nothing to save
                pass
        exit_now(code)

    return finish


def run_file(path: str, args: list) -> int:
    """Runs `path` as `__main__` as `python path args...` would; returns the exit status.
    Uses only locals once the program runs (it can reach and clear this text's globals)."""
    import atexit
    import traceback

    modules, stderr, write = sys.modules, sys.stderr, print
    print_exc, run_exit, is_a, int_ = traceback.print_exc, atexit._run_exitfuncs, isinstance, int
    sys.argv = [path, *args]
    sys.path[:] = ["."] + [p for p in sys.path if p]
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif is_a(e.code, int_):
            code = e.code
        else:
            write(e.code, file=stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - the program's own error, printed as Python would
        print_exc()
        code = 1
    threading = modules.get("threading")
    if threading is not None:
        threading._shutdown()  # non-daemon threads finish, as at interpreter exit
    run_exit()
    return code


# ----- the supervisor (PID 1 under bubblewrap) -----


def limit_workspace(libc, ws: str, size: int, inodes: int) -> bool:
    """Remounts the workspace tmpfs with its caps (needs CAP_SYS_ADMIN in the sandbox's user
    namespace, which bubblewrap grants for this step only); False when the kernel refused."""
    options = f"size={size},nr_inodes={inodes},mode=0755".encode()
    return libc.mount(b"tmpfs", ws.encode(), b"tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV,
                      options) == 0


def drop_privileges(libc, uid, gid) -> None:
    """Every capability gone for good; the sandbox's own uid where it has one."""
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: cannot drop capabilities")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: cannot set no_new_privs")
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _read_exactly(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("sandbox: the workspace stream ended early")
        out += chunk
    return bytes(out)


def receive_files(fd: int, ws: str) -> None:
    """Writes the frames on `fd` (directories, then files) under `ws`, until E."""
    while True:
        kind, n_name, n_data = FRAME.unpack(_read_exactly(fd, FRAME.size))
        if kind == b"E":
            return
        name = _read_exactly(fd, n_name)
        parts = name.split(b"/")
        if name.startswith(b"/") or b".." in parts or b"" in parts:
            raise ValueError(f"sandbox: bad name in the workspace stream: {name!r}")
        path = os.path.join(ws.encode(), name)
        if kind == b"D":
            os.makedirs(path, exist_ok=True)
            continue
        fd_out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            left = n_data
            while left:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    raise EOFError("sandbox: the workspace stream ended early")
                left -= len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd_out, view):]
        finally:
            os.close(fd_out)


def _frame(fd: int, kind: bytes, name: bytes = b"", data: bytes = b"") -> None:
    view = memoryview(FRAME.pack(kind, len(name), len(data)) + name + data)
    while view:
        view = view[os.write(fd, view):]


def _read_regular(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's bytes, at most `limit` + 1 of them (never a FIFO or a link: nothing
    runs that could swap them now)."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            return None
        chunks, n = [], 0
        while n <= limit and (chunk := os.read(f, min(1 << 20, limit + 1 - n))):
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(f)


def measure(ws: str, caps: dict) -> tuple[str, list]:
    """Walks the workspace by descriptors (no link followed, any depth or name length): why it
    is over a cap ("" if not), and its directories and regular files as [(kind, name, data)].
    Reading stops at the byte cap: every name of a hard-linked file counts, as the copy-back
    would write each, so the bytes held never pass `max_total_bytes` and one file."""
    entries, total, deepest = 0, 0, 0
    found = []
    stack = [(os.open(ws, os.O_RDONLY | os.O_DIRECTORY), b"", 1)]
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as it:
                    items = [(e.name, e.stat(follow_symlinks=False)) for e in it]
                for name, st in items:
                    entries += 1
                    deepest = max(deepest, depth)
                    rel = prefix + os.fsencode(name)
                    if stat.S_ISDIR(st.st_mode):
                        found.append((b"D", rel, b""))
                        try:
                            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                          dir_fd=fd)
                        except OSError:
                            continue
                        stack.append((sub, rel + b"/", depth + 1))
                    elif stat.S_ISREG(st.st_mode):
                        left = caps["max_total_bytes"] - total
                        data = _read_regular(fd, name, left) if st.st_size <= left else None
                        if st.st_size > left or (data is not None and len(data) > left):
                            return f"over {caps['max_total_bytes']} bytes", []
                        if data is not None:
                            total += len(data)
                            found.append((b"F", rel, data))
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    if entries > caps["max_files"]:
        return f"over {caps['max_files']} entries", found
    if total > caps["max_total_bytes"]:
        return f"over {caps['max_total_bytes']} bytes", found
    if deepest > caps["max_depth"]:
        return f"directories over {caps['max_depth']} levels deep", found
    return "", found


def send_files(fd: int, found: list) -> None:
    for kind, rel, data in found:
        _frame(fd, kind, rel, data)


def run_agent(libc, cfg: dict) -> None:
    """The agent's process (forked by the supervisor); never returns (whatever the program did
    to this text's globals: `finish` is bound first)."""
    finish = exiter()
    code = 1
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()  # kill(0, ...) and the terminal's signals reach this process only
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(3, 1 << 16)  # the status descriptor stays the supervisor's
        os.chdir(cfg["ws"])
        set_limits(cfg["limits"])
        install_filter(libc, bytes.fromhex(cfg["filter"]))
        install_hook()
        code = run_file(cfg["file"], cfg["args"])
    finally:
        finish(code)


def hold_namespace(libc) -> None:
    """PID 1 of the agent's PID namespace (never returns): no descriptor, no signal handler
    (the kernel drops every signal sent to a namespace's PID 1 from inside that it does not
    handle), dies with the supervisor. Its end ends the namespace, the agent with it."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in range(1, signal.NSIG):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # SIGKILL, SIGSTOP and the C library's own
        os.closerange(0, 1 << 16)
        os.setsid()
        while True:
            signal.pause()
    finally:
        os._exit(0)


def limit_self(memory: int) -> None:
    """The supervisor's own address-space cap (the soft limit: the agent's process, forked
    already, keeps its own)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (memory, hard))


def supervise(cfg: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    out = cfg["status_fd"]
    status = {"returncode": None, "signal": None, "timed_out": False, "caps_broken": "",
              "inode_limit": False, "error": None}
    holder = None
    try:
        ws = cfg["ws"]
        status["inode_limit"] = limit_workspace(libc, ws, cfg["ws_bytes"], cfg["inodes"])
        if cfg["uid"] is not None:
            os.chown(ws, cfg["uid"], cfg["gid"])
        if libc.unshare(CLONE_NEWPID) != 0:  # needs CAP_SYS_ADMIN: before the drop
            raise OSError(ctypes.get_errno(), "sandbox: cannot make the program's PID "
                          "namespace")
        drop_privileges(libc, cfg["uid"], cfg["gid"])
        receive_files(0, ws)
        start = time.monotonic()
        holder = os.fork()  # the namespace's PID 1
        if holder == 0:
            hold_namespace(libc)
        pid = os.fork()  # PID 2 there: the agent, this process's own child
        if pid == 0:
            run_agent(libc, cfg)
        limit_self(cfg["supervisor_memory"])
        caps = cfg["caps"]
        try:
            exited = [os.pidfd_open(pid)]  # readable once the child exits: no polling delay
        except (AttributeError, OSError):  # a kernel before 5.3: poll
            exited = []
        while True:
            left = start + cfg["timeout_s"] - time.monotonic()
            wait = left if status["inode_limit"] and exited else min(left, cfg["poll_s"])
            select.select(exited, [], [], max(0.0, wait))
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - start >= cfg["timeout_s"]:
                os.kill(pid, signal.SIGKILL)
                status["timed_out"] = True
                _, wait_status = os.waitpid(pid, 0)
                break
            if not status["inode_limit"]:  # the kernel does not hold the entry cap: watch it
                st = os.statvfs(ws)
                if st.f_files - st.f_ffree > caps["max_files"] + 1:
                    os.kill(pid, signal.SIGKILL)
                    status["caps_broken"] = f"over {caps['max_files']} entries"
                    _, wait_status = os.waitpid(pid, 0)
                    break
        status["duration_s"] = time.monotonic() - start
        if os.WIFSIGNALED(wait_status):
            status["signal"] = os.WTERMSIG(wait_status)
        else:
            status["returncode"] = os.WEXITSTATUS(wait_status)
        os.kill(holder, signal.SIGKILL)  # from outside its namespace: delivered
        os.waitpid(holder, 0)
        holder = None
        broken, found = measure(ws, caps)
        status["caps_broken"] = status["caps_broken"] or broken
        if not status["caps_broken"]:
            send_files(out, found)
    except Exception as e:  # noqa: BLE001 - reported to the trainer, which says what failed
        status["error"] = f"{type(e).__name__}: {e}"
    if holder:
        try:
            os.kill(holder, signal.SIGKILL)
        except OSError:
            pass
    _frame(out, b"S", b"", json.dumps(status).encode())
    _frame(out, b"E")


def direct(cfg: dict) -> None:
    """No bubblewrap: the legacy layers (`sandbox_guard.py`, prepended), then the file runs here,
    in the real workspace (the working directory)."""
    set_limits(cfg["limits"])
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.getcwd()
    reads = stdlib_dirs()  # noqa: F821 - from sandbox_guard.py's text
    enter_network_namespace(libc)  # noqa: F821
    restrict_files(libc, root, reads)  # noqa: F821
    install_filter(libc, bytes.fromhex(cfg["filter"]))
    del libc
    import _posixsubprocess

    _posixsubprocess.fork_exec = _no_fork_exec  # noqa: F821
    install_guard(root, reads)  # noqa: F821
    sys.path[:] = ["."] + [p for p in sys.path if any(
        os.path.realpath(p) == d or os.path.realpath(p).startswith(d + "/") for d in reads)]
    finish = exiter()
    finish(run_file(cfg["file"], cfg["args"]))


if __name__ == "__main__":
    _mode, _cfg = sys.argv[1], json.loads(sys.argv[2])
    del sys.argv[1:]
    supervise(_cfg) if _mode == "supervise" else direct(_cfg)
