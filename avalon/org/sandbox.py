"""Where `Workspace.run_python` runs an agent's program, and what holds it there.

Under bubblewrap (Debian's `bubblewrap`; the normal case) the kernel is the boundary:
- namespaces: user, PID, mount, network, IPC, UTS and cgroup; no nested user namespace. The
  program sees the interpreter, its standard library (its `site-packages` and `dist-packages`
  hidden by empty mounts: no package it was not given) and the directories of the shared
  libraries those load (as `ldd` finds them; read-only), a minimal /dev, and the workspace:
  nothing else of the machine exists for it;
- the workspace is a private tmpfs at /ws, its only writable place, capped in bytes and inodes
  by the kernel (unlinked and O_TMPFILE files count). The trainer streams the workspace's files
  in; after the run the sandbox's supervisor streams back its regular files and directories,
  which `Workspace` writes into the real workspace (links, FIFOs, sockets and names the file
  tools cannot name stay behind); a run over a cap changes nothing;
- identity: a trainer running as root gives the sandbox a uid of its own (uid 1000 in a user
  namespace that maps it to `SANDBOX_UID` outside: no file outside is its, and RLIMIT_NPROC
  counts only sandbox processes); any other trainer's sandbox runs as the trainer's uid. Never
  root, never a capability (the bounding set is emptied, no_new_privs set);
- it dies with the trainer (`--die-with-parent`; the program dies with the supervisor), in a
  session of its own (no terminal injection);
- the supervisor is out of the program's reach: the program runs in a PID namespace of its
  own, nested in the sandbox's, where the supervisor has no pid, so the program can neither
  signal it nor change its resource limits (it runs as the same uid); the supervisor caps its
  own address space (`supervisor_memory_bytes`) and reads the workspace back no further than
  its byte cap;
- system calls: an allowlist (`seccomp_filter.py`), default deny. Taking a file lock (`flock`,
  `fcntl` record locks) succeeds and does nothing: every sandbox sees the same read-only files
  and device nodes, and a lock on one would carry bits between programs of different
  organisations running at once;
- limits: address space (one process: no fork, no exec), CPU seconds, file size, open files,
  threads (RLIMIT_NPROC), no memfd, no System V shared memory, no writable tmpfs but the capped
  workspace, pipes at their default 64 KiB; wall time (the supervisor kills at
  `run_timeout_s`; the trainer kills the whole sandbox if it does not report soon after);
- stdout and stderr are read while the program runs and kept to `max_output_bytes` (stdout's
  head, stderr's tail), the rest counted and cut with a marker: printing more is not an error.
The audit hook that was the boundary stays only for readable errors.

Without a working bubblewrap (not installed, or user namespaces disabled) the program runs on
the real workspace with `sandbox_guard.py`'s layers (the network namespace and Landlock where
the kernel has them, the filter, the limits, the audit hook, which pure Python can switch off).
`layers()` says which layers hold here; `report_layers()` logs the missing ones once (the
first workspace of the process calls it). cgroups are not used: the limits above hold without
them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from avalon.org import seccomp_filter

log = logging.getLogger(__name__)
_BOOT = Path(__file__).with_name("sandbox_boot.py").read_text(encoding="utf-8")
_GUARD = Path(__file__).with_name("sandbox_guard.py").read_text(encoding="utf-8")
FRAME = struct.Struct(">cIQ")
WS = "/ws"  # the workspace, inside the sandbox
SANDBOX_UID = 2147400000  # outside: the sandbox's own uid when the trainer is root
INSIDE_UID = 1000
POLL_S = 0.02  # the supervisor's wait and watch interval
# After the time limit, for the sandbox's start-up and for the supervisor to send the workspace
# back: only a safety net against a supervisor that never reports (a loaded machine can take
# seconds to start a process, so it is generous).
REPORT_GRACE_S = 60.0
CAPS = ("CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # setup only
# The supervisor's address space before it reads the workspace back (the interpreter and its
# libraries: 16 MiB measured on CPython 3.11), with room.
SUPERVISOR_BASE_BYTES = 64 << 20
HIDDEN_PACKAGES = ("site-packages", "dist-packages")  # inside the standard library's directories


@dataclasses.dataclass(frozen=True)
class WorkspaceLimits:
    """The caps of a workspace and of every run in it (the file tools check the file caps
    before writing; a run is held to all of them, see the module docstring)."""

    max_file_bytes: int = 1 << 20
    max_total_bytes: int = 16 << 20
    max_files: int = 512  # entries of any kind: files, directories, links, ...
    run_timeout_s: float = 10.0
    run_memory_mb: int = 1024
    max_output_bytes: int = 16 << 10  # of stdout (its head) and stderr (its tail) returned
    max_depth: int = 32  # directory levels of a path
    max_open_files: int = 64  # RLIMIT_NOFILE of a run (it also bounds pipes and sockets)
    max_threads: int = 64  # threads of a run (RLIMIT_NPROC of the sandbox's uid)


@dataclasses.dataclass(frozen=True)
class Layers:
    """What holds on this machine (see the module docstring)."""

    bubblewrap: bool  # namespaces, the private workspace, the kernel caps on it
    own_uid: bool  # a uid only the sandbox uses (the trainer is root)
    filter: bool  # the seccomp allowlist (an architecture with a table)
    inode_cap: bool  # the workspace's inode cap held by the kernel (else watched)
    why: str = ""  # why bubblewrap is not used, when it is not
    landlock: int = 0  # without bubblewrap: Landlock's ABI (0: none)
    network_namespace: bool = False  # without bubblewrap: a fresh network namespace

    def missing(self) -> list[str]:
        if not self.bubblewrap:
            out = [f"bubblewrap ({self.why}): no user, PID or mount namespace, the program runs "
                   "on the real workspace with an audit hook that pure Python can switch off"]
            if not self.landlock:
                out.append("Landlock: files outside the workspace are not confined by the "
                           "kernel")
            if not self.network_namespace:
                out.append("network namespace")
        else:
            out = []
            if not self.own_uid:
                out.append("a uid of the sandbox's own (the trainer is not root): the sandbox "
                           "runs as the trainer's uid, and RLIMIT_NPROC counts within the "
                           "sandbox's user namespace")
            if not self.inode_cap:
                out.append("the kernel's inode cap on the workspace: it is watched instead")
        if not self.filter:
            out.append(f"the system-call filter (no table for {os.uname().machine}): runs "
                       "fail")
        return out


@dataclasses.dataclass
class RawRun:
    """What one run did, before the workspace applies it."""

    returncode: int | None  # -N: killed by signal N (as subprocess says); None: timed out
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool
    caps_broken: str = ""
    files: list[tuple[bytes, bytes, bytes]] | None = None  # (D|F, name, data); None: unchanged
    error: str = ""  # the sandbox itself failed (said in stderr too)


def supervisor_memory_bytes(lim: WorkspaceLimits) -> int:
    """The supervisor's own address-space cap: its base, the workspace's bytes it reads back,
    and a few copies of one file (read, joined, framed)."""
    return SUPERVISOR_BASE_BYTES + lim.max_total_bytes + 4 * lim.max_file_bytes


def own_uid() -> bool:
    """Whether the sandbox gets a uid of its own (only root can map one)."""
    return os.geteuid() == 0


@functools.cache
def _interpreter() -> tuple[str, list[str]]:
    """The base interpreter (not a venv's link) and its standard library's directories (the
    base installation's: a venv's `platstdlib` would be the venv, packages and all)."""
    exe = os.path.realpath(sys.executable)
    base = {"installed_base": sys.base_prefix, "base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix, "platbase": sys.base_exec_prefix}
    reads = {os.path.realpath(sysconfig.get_path(k, vars=base)) for k in ("stdlib", "platstdlib")}
    return exe, sorted(reads)


def _hidden_packages(reads: list[str]) -> list[str]:
    """The package directories inside the standard library's, which the sandbox hides."""
    return sorted(os.path.join(d, name) for d in reads for name in HIDDEN_PACKAGES
                  if os.path.isdir(os.path.join(d, name)))


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The directories of the shared libraries the interpreter and the standard library's
    extension modules load, and of the loader, as `ldd` resolves them (each as named and as
    its links resolve, so either path works inside)."""
    exe, reads = _interpreter()
    files = [exe] + sorted(str(p) for d in reads for p in Path(d, "lib-dynload").glob("*.so"))
    ldd = shutil.which("ldd")
    if ldd is None:
        raise OSError("sandbox: ldd is missing (Debian's libc-bin): it finds the shared "
                      "libraries the interpreter needs")
    out = subprocess.run([ldd, *files], capture_output=True, text=True, timeout=120)
    dirs = set()
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.endswith(":"):  # the header naming the file that follows
            continue
        path = (line.split("=>", 1)[1] if "=>" in line else line).split("(", 1)[0].strip()
        if path.startswith("/") and os.path.exists(path):
            dirs |= {os.path.realpath(os.path.dirname(path)),
                     os.path.dirname(os.path.realpath(path))}
    if not dirs:
        raise OSError(f"sandbox: ldd found no shared library of {exe}: {out.stderr[-200:]}")
    return tuple(sorted(dirs))


def _system_binds() -> tuple[list[str], list[str]]:
    """bubblewrap's arguments for the shared libraries and the loader's cache (read-only), and
    the paths they make: the top-level links of a merged /usr as links, and only the
    directories of the libraries the interpreter loads."""
    args, dests = [], []
    for top in ("/lib", "/lib32", "/lib64", "/libx32", "/bin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
            dests.append(top)
    for d in _library_dirs():
        args += ["--ro-bind", d, d]
        dests.append(d)
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        dests.append("/etc/ld.so.cache")
    return args, dests


def _parents(paths) -> list[str]:
    """Every directory above `paths`, outermost first (bubblewrap would make them 0700)."""
    out = set()
    for p in paths:
        parent = os.path.dirname(p)
        while parent not in ("/", ""):
            out.add(parent)
            parent = os.path.dirname(parent)
    return sorted(out, key=lambda p: (p.count("/"), p))


class _UserNamespaces:
    """User namespaces that map uid/gid 0 to 0 (bubblewrap sets the sandbox up as root in it)
    and 1000 to `SANDBOX_UID` (the supervisor then becomes 1000 and drops everything). Writing
    another uid's map needs root, so a helper process makes each one; one per sandbox running
    at the same time, reused (RLIMIT_NPROC counts per namespace)."""

    HELPER = ("import ctypes, sys\n"
              "if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:\n"
              "    sys.exit(1)\n"
              "print('ready', flush=True)\n"
              "sys.stdin.read()\n")

    def __init__(self):
        self._free: list[int] = []
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
        exe, _ = _interpreter()
        helper = subprocess.Popen([exe, "-I", "-S", "-c", self.HELPER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            if helper.stdout.readline().strip() != b"ready":
                raise OSError("sandbox: cannot make a user namespace")
            for kind in ("uid_map", "gid_map"):
                with open(f"/proc/{helper.pid}/{kind}", "w") as f:
                    f.write(f"0 0 1\n{INSIDE_UID} {SANDBOX_UID} 1\n")
            return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            helper.stdin.close()
            helper.wait()

    def release(self, fd: int) -> None:
        with self._lock:
            self._free.append(fd)


_NAMESPACES = _UserNamespaces()


def _bwrap_args(userns_fd: int | None, ws_bytes: int) -> list[str]:
    exe, reads = _interpreter()
    binds = [exe, *reads]
    args = [shutil.which("bwrap") or "bwrap"]
    if userns_fd is not None:
        args += ["--userns", str(userns_fd)]
    else:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--uid", "0", "--gid", "0", "--die-with-parent",
             "--new-session", "--as-pid-1"]
    for cap in CAPS:
        args += ["--cap-add", cap]
    system, dests = _system_binds()
    for d in _parents(binds + dests + [WS]):
        args += ["--perms", "0755", "--dir", d]
    args += system
    for p in binds:
        args += ["--ro-bind", p, p]
    for hidden in _hidden_packages(reads):  # an empty, read-only directory in its place
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden, "--remount-ro", hidden]
    # The sandbox's root and /dev are tmpfs mounts of its own user namespace: read-only, so
    # the workspace (capped) is the only place anything can be written.
    args += ["--dev", "/dev", "--size", str(ws_bytes), "--perms", "0755", "--tmpfs", WS,
             "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", WS, "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
             "--setenv", "HOME", WS, "--setenv", "TMPDIR", WS, "--setenv", "LANG", "C.UTF-8",
             exe, "-I", "-B", "-S", "-c", _BOOT]
    return args


def _limits(lim) -> dict[str, int]:
    return {"RLIMIT_AS": lim.run_memory_mb << 20, "RLIMIT_CPU": int(lim.run_timeout_s) + 1,
            "RLIMIT_FSIZE": lim.max_file_bytes, "RLIMIT_NOFILE": lim.max_open_files,
            # Besides the threads: the supervisor, the program's namespace's PID 1, the program.
            "RLIMIT_NPROC": lim.max_threads + 3, "RLIMIT_CORE": 0, "RLIMIT_MEMLOCK": 0}


def _workspace_bytes(lim) -> int:
    """The tmpfs's size: the byte cap plus a page per entry (small files' tails)."""
    return lim.max_total_bytes + 4096 * (lim.max_files + 1)


@functools.cache
def _filter_hex() -> str:
    return seccomp_filter.program_bytes(os.uname().machine).hex()


def _config(lim, rel: str, args, **extra) -> dict:
    return {"limits": _limits(lim), "file": rel, "args": list(args), "filter": _filter_hex(),
            "timeout_s": lim.run_timeout_s, "poll_s": POLL_S, **extra}


class _Output:
    """One stream of the program, kept to `cap` bytes (the head, or the tail)."""

    def __init__(self, cap: int, keep_tail: bool):
        self.cap, self.keep_tail = cap, keep_tail
        self.kept = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.keep_tail:
            self.kept += data
            del self.kept[:max(0, len(self.kept) - self.cap)]
        elif len(self.kept) < self.cap:
            self.kept += data[:self.cap - len(self.kept)]

    def text(self) -> str:
        body = bytes(self.kept).decode("utf-8", errors="replace")
        cut = self.total - len(self.kept)
        if not cut:
            return body
        note = f"(output truncated: {cut} bytes not shown)"
        return f"{note}\n{body}" if self.keep_tail else f"{body}\n{note}"


def _collect(proc: subprocess.Popen, streams: dict, deadline: float, tick=None) -> bool:
    """Reads the child's pipes (`streams`: fd -> sink with `add`) until all close; calls
    `tick()` every poll (a truthy result, or the deadline, kills the process group). True when
    it ended by itself."""
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    ended = True
    try:
        while sel.get_map():
            for key, _ in sel.select(timeout=POLL_S * 5):
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if data:
                    streams[key.fd].add(data)
                else:
                    sel.unregister(key.fd)
            if time.monotonic() > deadline or (tick is not None and tick()):
                ended = False
                _kill(proc)
                break
    finally:
        sel.close()
    proc.wait()
    return ended


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Frames:
    """The supervisor's report: frames, bounded in bytes."""

    def __init__(self, cap: int):
        self.buf = bytearray()
        self.cap = cap
        self.over = False

    def add(self, data: bytes) -> None:
        if len(self.buf) + len(data) > self.cap:
            self.over = True
            return
        self.buf += data

    def parse(self) -> tuple[list, dict | None]:
        files, status, at = [], None, 0
        buf = bytes(self.buf)
        while at + FRAME.size <= len(buf):
            kind, n_name, n_data = FRAME.unpack_from(buf, at)
            at += FRAME.size
            name, data = buf[at:at + n_name], buf[at + n_name:at + n_name + n_data]
            at += n_name + n_data
            if kind in (b"D", b"F"):
                files.append((kind, name, data))
            elif kind == b"S":
                status = json.loads(data)
        return files, status


def _stream_in(ws, lim) -> bytes:
    """The workspace's directories and regular files as frames, then E."""
    dirs, files = ws.tree()
    out = bytearray()
    for d in dirs:
        name = d.encode("utf-8")
        out += FRAME.pack(b"D", len(name), 0) + name
    for f in files:
        name, data = f.encode("utf-8"), ws.read_bytes(f)
        out += FRAME.pack(b"F", len(name), len(data)) + name + data
    return bytes(out + FRAME.pack(b"E", 0, 0))


def run_bwrap(ws, rel: str, args) -> RawRun:
    """One run under bubblewrap (module docstring)."""
    lim = ws.limits
    root_mode = own_uid()
    userns = _NAMESPACES.acquire() if root_mode else None
    status_r, status_w = os.pipe()
    ws_bytes = _workspace_bytes(lim)
    cfg = _config(lim, rel, args, ws=WS, status_fd=status_w,
                  uid=INSIDE_UID if root_mode else None, gid=INSIDE_UID if root_mode else None,
                  ws_bytes=ws_bytes, inodes=lim.max_files + 1,
                  supervisor_memory=supervisor_memory_bytes(lim),
                  caps={"max_files": lim.max_files, "max_total_bytes": lim.max_total_bytes,
                        "max_depth": lim.max_depth})
    keep = (status_w,) + ((userns,) if userns is not None else ())
    stdout, stderr = _Output(lim.max_output_bytes, False), _Output(lim.max_output_bytes, True)
    frames = _Frames(ws_bytes + (4 << 20))
    start = time.monotonic()
    try:
        proc = subprocess.Popen(_bwrap_args(userns, ws_bytes) + ["supervise", json.dumps(cfg)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=keep, start_new_session=True)
    finally:
        os.close(status_w)
    try:
        try:
            proc.stdin.write(_stream_in(ws, lim))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        ended = _collect(proc, {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr,
                                status_r: frames},
                         start + lim.run_timeout_s + REPORT_GRACE_S,
                         tick=lambda: frames.over)
    finally:
        os.close(status_r)
        proc.stdout.close()
        proc.stderr.close()
        if userns is not None:
            _NAMESPACES.release(userns)
    duration = time.monotonic() - start
    files, status = frames.parse()
    if not ended or status is None or status.get("error"):
        if not ended:
            why = f"it did not report within {lim.run_timeout_s + REPORT_GRACE_S:g} s"
        elif frames.over:
            why = "its report was too large"
        else:
            why = status["error"] if status else f"bubblewrap exited {proc.returncode}"
        return RawRun(None, stdout.text(), stderr.text() + f"\n(sandbox failed: {why})",
                      duration, not ended, error=why)
    code = None if status["timed_out"] else (
        -status["signal"] if status["signal"] is not None else status["returncode"])
    broken = status["caps_broken"]
    return RawRun(code, stdout.text(), stderr.text(), status.get("duration_s", duration),
                  status["timed_out"], broken, None if broken else files)


def run_direct(ws, rel: str, args, watch) -> RawRun:
    """One run without bubblewrap, on the real workspace (`sandbox_guard.py`'s layers);
    `watch()` says why the workspace broke its caps ("" if not), checked every poll."""
    lim = ws.limits
    cfg = _config(lim, rel, args)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ws.root), "TMPDIR": str(ws.root),
           "LANG": "C.UTF-8"}
    stdout, stderr = _Output(lim.max_output_bytes, False), _Output(lim.max_output_bytes, True)
    exe, _ = _interpreter()
    start = time.monotonic()
    proc = subprocess.Popen([exe, "-I", "-B", "-S", "-c", _GUARD + "\n" + _BOOT, "direct",
                             json.dumps(cfg)], cwd=ws.root, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    broken = [""]
    last = [start]

    def tick():
        now = time.monotonic()
        if now - last[0] >= 0.1:
            last[0] = now
            broken[0] = watch()
        return bool(broken[0])

    try:
        ended = _collect(proc, {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr},
                         start + lim.run_timeout_s, tick)
    finally:
        proc.stdout.close()
        proc.stderr.close()
    timed_out = not ended and not broken[0]
    code = None if timed_out else proc.returncode
    return RawRun(code, stdout.text(), stderr.text(), time.monotonic() - start, timed_out,
                  broken[0] or watch())


@dataclasses.dataclass(frozen=True)
class _ProbeFiles:
    """What `run_bwrap` reads of a workspace (its limits, its tree, its files' bytes), for the
    probe's one program: the probe needs no directory of its own."""

    limits: WorkspaceLimits
    files: dict[str, bytes]

    def tree(self) -> tuple[list[str], list[str]]:
        return [], list(self.files)

    def read_bytes(self, rel: str) -> bytes:
        return self.files[rel]


@functools.cache
def layers() -> Layers:
    """What holds here (probed once: a program is run in each mode that could work)."""
    machine = os.uname().machine
    has_filter = machine in seccomp_filter.AUDIT_ARCH
    own = own_uid()
    why = ""
    inode_cap = False
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        why = "not installed: apt-get install bubblewrap"
    elif not has_filter:
        why = "no system-call filter for this architecture"
    else:
        probe = _ProbeFiles(WorkspaceLimits(run_timeout_s=30.0), {
            "probe.py": b"import os\nst = os.statvfs('.')\nprint(st.f_files, os.getuid())\n"})
        try:
            r = run_bwrap(probe, "probe.py", ())
        except OSError as e:
            r = RawRun(None, "", "", 0.0, False, error=str(e))
        if r.error or r.returncode != 0:
            why = f"it does not run here: {(r.error or r.stderr).strip()[-200:]}"
        else:
            inode_cap = r.stdout.split()[0] == str(WorkspaceLimits().max_files + 1)
    if why:
        return Layers(False, False, has_filter, False, why, _probe_landlock(),
                      _probe_netns())
    return Layers(True, own, has_filter, inode_cap)


def _probe_guard(call: str) -> int:
    code = ("import ctypes\n" + _GUARD + f"\nprint(int({call}(ctypes.CDLL(None, "
            "use_errno=True))))\n")
    try:
        out = subprocess.run([_interpreter()[0], "-I", "-S", "-c", code], capture_output=True,
                             text=True, timeout=30, check=True)
        return int(out.stdout)
    except (subprocess.SubprocessError, ValueError):
        return 0


def _probe_landlock() -> int:
    return _probe_guard("landlock_abi")


def _probe_netns() -> bool:
    return _probe_guard("enter_network_namespace") == 1


_reported = threading.Event()


def report_layers() -> None:
    """Logs, once per process, the sandbox layers this machine lacks (nothing when none)."""
    if _reported.is_set():
        return
    _reported.set()
    missing = layers().missing()
    if missing:
        log.warning("sandbox: this machine lacks %s", "; ".join(missing))
