"""A rollout's workspace: a directory the agents' file tools are confined to, and a sandbox.

Paths. Agents name files relative to the workspace root. Refused (a `ToolError`, never an
exception out of the simulator): empty paths, NUL bytes, absolute paths, any `..` component,
and any path whose real location (symlinks resolved) is outside the root; writes also refuse a
symlink as the final component (`O_NOFOLLOW`). Caps on the file tools: bytes per file, bytes
in total, number of files (code run in the sandbox is held to bytes per file and its time).

`run_python(path)` runs a workspace file with this interpreter in a child process:
- time: killed (with its process group) after `run_timeout_s` wall seconds; RLIMIT_CPU too;
- memory: RLIMIT_AS = `run_memory_mb`; file size: RLIMIT_FSIZE = `max_file_bytes`;
- network: the child first tries to enter a fresh network namespace (`unshare(CLONE_NEWNET)`,
  then `CLONE_NEWUSER | CLONE_NEWNET`), which leaves it only a downed loopback; where the kernel
  refuses both, only the second layer holds: an audit hook installed before the code runs
  refuses `socket.connect/bind/sendto/sendmsg/getaddrinfo` and starting processes
  (`subprocess.Popen`, `os.system`, `os.exec*`, `os.posix_spawn`, `os.fork`). The hook stops
  Python code, not native code that makes syscalls itself; `network_namespaces_available()`
  says which case holds;
- environment: a minimal one (PATH, HOME = the workspace, LANG); `python -I -B` (no user
  site, no PYTHON* variables, no bytecode files written).
The duration returned is measured wall time (such tool calls are logged `measured`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from avalon.org.env import ToolError

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000

# The child sets its own limits before running the agent's code: no `preexec_fn`, since running
# Python between fork and exec in a multithreaded parent (JAX's) can deadlock. argv: the limits
# (address space, CPU seconds, file size), the file, then the file's own arguments.
_BOOT = r"""
import ctypes, resource, runpy, sys
mem, cpu, fsize = (int(a) for a in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_libc = ctypes.CDLL(None, use_errno=True)
if _libc.unshare(NEWNET) != 0:
    _libc.unshare(NEWUSER | NEWNET)
del _libc
_BLOCKED = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
    "os.fork", "os.forkpty", "pty.spawn"})
def _guard(event, args):
    if event in _BLOCKED:
        raise PermissionError("sandbox: " + event + " is not allowed")
sys.addaudithook(_guard)
path = sys.argv[4]
sys.argv = sys.argv[4:]
sys.path.insert(0, ".")
runpy.run_path(path, run_name="__main__")
""".replace("NEWNET", str(_CLONE_NEWNET)).replace("NEWUSER", str(_CLONE_NEWUSER))


@dataclasses.dataclass(frozen=True)
class WorkspaceLimits:
    max_file_bytes: int = 1 << 20
    max_total_bytes: int = 16 << 20
    max_files: int = 512
    run_timeout_s: float = 10.0
    run_memory_mb: int = 1024
    max_output_bytes: int = 16 << 10  # of stdout (its head) and stderr (its tail) returned


@dataclasses.dataclass(frozen=True)
class RunResult:
    returncode: int | None  # None when killed for time
    stdout: str
    stderr: str
    duration_s: float  # measured wall time
    timed_out: bool


@functools.cache
def network_namespaces_available() -> bool:
    """Whether a child can enter a fresh network namespace here (probed once)."""
    probe = ("import ctypes,sys; c=ctypes.CDLL(None); "
             f"sys.exit(0 if c.unshare({_CLONE_NEWNET})==0 or "
             f"c.unshare({_CLONE_NEWUSER | _CLONE_NEWNET})==0 else 1)")
    return subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


class Workspace:
    """File tools confined to `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike, limits: WorkspaceLimits = WorkspaceLimits()):
        Path(root).mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.realpath(root))
        self.limits = limits

    def resolve(self, rel: str) -> Path:
        """The absolute path of `rel` inside the workspace, or a ToolError saying why not."""
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty string")
        if "\x00" in rel:
            raise ToolError("path contains a NUL byte")
        if rel.startswith(("/", "\\")) or os.path.isabs(rel):
            raise ToolError(f"path {rel!r} is absolute; use a path inside the workspace")
        parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolError(f"path {rel!r} contains '..'")
        target = self.root.joinpath(*parts)
        real = os.path.realpath(target)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise ToolError(f"path {rel!r} leaves the workspace")
        return target

    def read(self, rel: str) -> str:
        path = self.resolve(rel)
        if not path.is_file():
            raise ToolError(f"no file {rel!r}")
        size = path.stat().st_size
        if size > self.limits.max_file_bytes:
            raise ToolError(f"{rel!r} is {size} bytes; the limit is {self.limits.max_file_bytes}")
        return path.read_bytes().decode("utf-8", errors="replace")

    def write(self, rel: str, text: str) -> int:
        """Writes `text` (UTF-8) and returns its size in bytes."""
        path = self.resolve(rel)
        data = text.encode("utf-8", errors="replace")
        if len(data) > self.limits.max_file_bytes:
            raise ToolError(f"{len(data)} bytes is over the per-file limit "
                            f"{self.limits.max_file_bytes}")
        if path.is_dir():
            raise ToolError(f"{rel!r} is a directory")
        files, total = self._usage()
        old = path.stat().st_size if path.is_file() else 0
        if old == 0 and not path.is_file() and files + 1 > self.limits.max_files:
            raise ToolError(f"the workspace already holds {files} files (limit)")
        if total - old + len(data) > self.limits.max_total_bytes:
            raise ToolError(f"the workspace would exceed {self.limits.max_total_bytes} bytes")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(rel)  # a parent made by mkdir cannot be a symlink, but check again
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return len(data)

    def exists(self, rel: str) -> bool:
        try:
            return self.resolve(rel).is_file()
        except ToolError:
            return False

    def listdir(self, rel: str = ".") -> list[str]:
        """Files under `rel` (recursive), as workspace-relative paths, sorted."""
        base = self.root if rel.strip() in ("", ".") else self.resolve(rel)
        if not base.is_dir():
            raise ToolError(f"no directory {rel!r}")
        out = []
        for dirpath, _, names in os.walk(base):
            for n in names:
                out.append(os.path.relpath(os.path.join(dirpath, n), self.root))
        return sorted(out)

    def _usage(self) -> tuple[int, int]:
        files = total = 0
        for dirpath, _, names in os.walk(self.root):
            for n in names:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    files += 1
                    total += os.path.getsize(p)
        return files, total

    def run_python(self, rel: str, args: tuple[str, ...] = ()) -> RunResult:
        """Runs a workspace Python file in the sandbox described in the module docstring."""
        path = self.resolve(rel)
        if not path.is_file():
            raise ToolError(f"no file {rel!r}")
        lim = self.limits
        limits = (str(lim.run_memory_mb << 20), str(int(lim.run_timeout_s) + 1),
                  str(lim.max_file_bytes))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8"}
        with tempfile.TemporaryDirectory(prefix="avalon-run-") as tmp:
            out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                start = time.monotonic()
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-B", "-c", _BOOT, *limits,
                     str(path.relative_to(self.root)), *args], cwd=self.root, env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
                try:
                    code: int | None = proc.wait(timeout=lim.run_timeout_s)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    code, timed_out = None, True
                duration = time.monotonic() - start
            stdout, stderr = self._head(out_path), self._tail(err_path)
        return RunResult(code, stdout, stderr, duration, timed_out)

    def _tail(self, path: str) -> str:
        """The end of a stream (where a traceback's error is)."""
        n = self.limits.max_output_bytes
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            text = f.read().decode("utf-8", errors="replace")
        return ("(output truncated)\n" if size > n else "") + text

    def _head(self, path: str) -> str:
        with open(path, "rb") as f:
            data = f.read(self.limits.max_output_bytes + 1)
        text = data[:self.limits.max_output_bytes].decode("utf-8", errors="replace")
        return text + ("\n(output truncated)" if len(data) > self.limits.max_output_bytes else "")
