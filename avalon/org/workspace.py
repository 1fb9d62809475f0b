"""A rollout's workspace: a directory the agents' file tools are confined to, and a sandbox.

Paths. Agents name files relative to the workspace root. Refused (a `ToolError`, never an
exception out of the simulator): empty paths, NUL bytes, absolute paths, any `..` component,
and any path whose real location (symlinks resolved) is outside the root; writes also refuse a
symlink as the final component (`O_NOFOLLOW`). Caps on the file tools: bytes per file, bytes
in total, number of files (code run in the sandbox is held to bytes per file and its time).

`run_python(path)` runs a workspace file with this interpreter in a child process, which first
runs `avalon/org/sandbox_boot.py` (its docstring has every rule):
- time: killed (with its process group) after `run_timeout_s` wall seconds; RLIMIT_CPU too;
- memory: RLIMIT_AS = `run_memory_mb`; file size: RLIMIT_FSIZE = `max_file_bytes`;
- files: reading only the workspace and the standard library, writing only the workspace
  (symlinks and `..` resolved), no deleting, renaming, chmod, linking or chdir outside it;
- processes and signals: no starting processes, no `os.kill`/`killpg`/`pthread_kill`;
- network: a fresh network namespace (only a downed loopback) where the kernel allows one,
  and no `socket.connect/bind/sendto/sendmsg/getaddrinfo`;
- native code: no `ctypes`, no native modules from outside the standard library;
- environment: a minimal one (PATH, HOME = TMPDIR = the workspace, LANG); `python -I -B` (no
  user site, no PYTHON* variables, no bytecode files written).
Two layers: an audit hook (always; clear `PermissionError("sandbox: ...")` errors) stops Python
code; below it the kernel, where it has them: the network namespace and Landlock (files,
executing, TCP, signals), which also hold against native code. `sandbox_layers()` says which
kernel layers hold here.
The duration returned is measured wall time (such tool calls are logged `measured`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from avalon.org.env import ToolError

# The child sets its own limits and sandbox before running the agent's code (no `preexec_fn`:
# running Python between fork and exec in a multithreaded parent, JAX's, can deadlock). argv:
# the limits (address space, CPU seconds, file size), the file, then the file's own arguments.
_BOOT_FILE = Path(__file__).with_name("sandbox_boot.py")
_BOOT = _BOOT_FILE.read_text(encoding="utf-8")


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


def _probe(call: str) -> int:
    """Runs `call` on sandbox_boot's functions in a fresh child; returns what it prints."""
    code = (f"import ctypes, sys\nns = {{'__name__': 'probe'}}\n"
            f"exec(open({str(_BOOT_FILE)!r}).read(), ns)\n"
            f"print(int(ns[{call!r}](ctypes.CDLL(None, use_errno=True))))")
    out = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True,
                         text=True, timeout=30, check=True)
    return int(out.stdout)


@functools.cache
def network_namespaces_available() -> bool:
    """Whether a child can enter a fresh network namespace here (probed once)."""
    return _probe("enter_network_namespace") == 1


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI (0: none), i.e. whether file confinement holds below the hook."""
    return _probe("landlock_abi")


def sandbox_layers() -> dict[str, bool]:
    """Which sandbox layers hold here, besides the audit hook (always)."""
    abi = landlock_abi()
    return {"network_namespace": network_namespaces_available(), "landlock_files": abi >= 1,
            "landlock_tcp": abi >= 4, "landlock_signals": abi >= 6}


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

    def key(self, rel: str) -> str:
        """The canonical name of workspace path `rel` (as `listdir` gives it)."""
        return str(self.resolve(rel).relative_to(self.root))

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Every regular file (symlinks skipped): its key -> (mtime in ns, size)."""
        out = {}
        for dirpath, _, names in os.walk(self.root):
            for n in names:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    out[os.path.relpath(p, self.root)] = (st.st_mtime_ns, st.st_size)
        return out

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
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root), "TMPDIR": str(self.root),
               "LANG": "C.UTF-8"}
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
