"""A rollout's workspace: a directory the agents' file tools are confined to, and a sandbox.

Paths. Agents name files relative to the workspace root. Refused (a `ToolError`, never an
exception out of the simulator): empty paths, NUL bytes, lone surrogates, absolute paths, any
`..` component, names over 255 bytes, paths over 4,096 bytes or `max_depth` levels, names with
control, bidi or zero-width characters (`names.py`). Every operation goes by directory
descriptors (`beneath.py`: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a
per-component `O_NOFOLLOW` walk), so no symlink is followed on any component and a program
swapping directories and links meanwhile cannot redirect it; only regular files are read or
written (a FIFO, socket, device or link is a tool error, checked before opening and opened
`O_NONBLOCK`, so nothing blocks). Listing and snapshots read directories by descriptor too, so
they stand whatever a program made (FIFOs, sockets, link loops, deep or long paths, unreadable
files); `listdir` gives only the files the tools can name. `resolve` gives a path's absolute
name (for messages), never one to open: `read_bytes`/`write_bytes`/`remove`/`size` are the
race-free operations.

Caps: bytes per file, bytes in total, entries (files, directories, links, ...) in total, depth.
The file tools check them before writing; sandboxed code is held to them by the kernel (the
sandbox's workspace is a tmpfs of that many bytes and inodes, and RLIMIT_FSIZE per file), and a
run whose workspace ends over a cap changes nothing (`RunResult.caps_broken`).

`run_python(path)` runs a workspace file in the sandbox of `avalon/org/sandbox.py` (its
docstring has every rule: namespaces, the uid, the system-call filter, the limits). Under
bubblewrap the program works on a private copy of the workspace; its regular files and
directories are written back after the run (`_apply`: only what changed, so a file's mtime
moves only when its bytes do), all or nothing: every name is checked first, by the file tools'
own rule (`nameable`: one check, so no name passes it and fails a later step), and only then
does anything change. Without bubblewrap it works on this directory, watched every
0.1 s, and a run over a cap has everything it created or changed removed. Stdout and stderr
are kept to `max_output_bytes` each (a marker says how much was cut). The duration returned is
measured wall time (such tool calls are logged `measured`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
from pathlib import Path

from avalon.org import beneath, sandbox
from avalon.org.errors import ToolError
from avalon.org.names import name_problem
from avalon.org.sandbox import WorkspaceLimits

MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4096  # per component, whole path (Linux's NAME_MAX, PATH_MAX)
MAX_ARGS, MAX_ARGS_BYTES = 256, 64 << 10  # of run_python's program arguments
# The caps (`sandbox.WorkspaceLimits`: the sandbox holds every run to them).
DEFAULT_LIMITS = WorkspaceLimits()


@dataclasses.dataclass(frozen=True)
class RunResult:
    returncode: int | None  # None when killed for time
    stdout: str
    stderr: str
    duration_s: float  # measured wall time
    timed_out: bool
    changed: tuple[str, ...] = ()  # keys of the regular files the run created or changed
    caps_broken: str = ""  # why the run broke the workspace caps ("" if not): its changes are gone


def sandbox_layers() -> dict[str, object]:
    """Which sandbox layers hold here (`sandbox.Layers`, as a dict)."""
    return dataclasses.asdict(sandbox.layers())


class Workspace:
    """File tools confined to `root` (created if missing); see the module docstring."""

    def __init__(self, root: str | os.PathLike, limits: WorkspaceLimits = DEFAULT_LIMITS,
                 *, probe: bool = True):
        Path(root).mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.realpath(root))
        self.limits = limits
        if probe:  # the first workspace of a process says which sandbox layers are missing
            sandbox.report_layers()

    # ----- paths -----

    def parts(self, rel: str) -> tuple[str, ...]:
        """The components of workspace path `rel` (() for the root), or a ToolError saying why
        it is not one."""
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty string")
        if "\x00" in rel:
            raise ToolError("path contains a NUL byte")
        try:
            size = len(rel.encode("utf-8"))
        except UnicodeEncodeError:
            raise ToolError(f"path {_show(rel)} is not valid text (a lone surrogate)") from None
        if size > MAX_PATH_BYTES:
            raise ToolError(f"path {_show(rel)} is {size} bytes; the limit is {MAX_PATH_BYTES}")
        if rel.startswith(("/", "\\")) or os.path.isabs(rel):
            raise ToolError(f"path {_show(rel)} is absolute; use a path inside the workspace")
        parts = tuple(p for p in rel.replace("\\", "/").split("/") if p not in ("", "."))
        if ".." in parts:
            raise ToolError(f"path {_show(rel)} contains '..'")
        for p in parts:
            if len(p.encode("utf-8")) > MAX_NAME_BYTES:
                raise ToolError(f"path {_show(rel)}: a name of {len(p.encode('utf-8'))} bytes; "
                                f"the limit is {MAX_NAME_BYTES}")
            problem = name_problem(p)
            if problem is not None:  # file names are shown in every teammate's listings
                raise ToolError(f"path {_show(rel)}: in {_show(p)}, {problem}")
        if len(parts) > self.limits.max_depth:
            raise ToolError(f"path {_show(rel)} is {len(parts)} levels deep; the limit is "
                            f"{self.limits.max_depth}")
        return parts

    def resolve(self, rel: str) -> Path:
        """The absolute name of `rel` inside the workspace, or a ToolError saying why not.

        A name only: open files with the methods below, which follow no symlink."""
        return self.root.joinpath(*self.parts(rel))

    def key(self, rel: str) -> str:
        """The canonical name of workspace path `rel` (as `listdir` gives it)."""
        return "/".join(self.parts(rel))

    @contextlib.contextmanager
    def _root_fd(self):
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self.root, flags)
            except PermissionError:  # a program locked the root (chmod '.'): the trainer owns it
                os.chmod(self.root, 0o755)
                fd = os.open(self.root, flags)
            except FileNotFoundError:  # removed (possible only where Landlock is missing)
                self.root.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.root, flags)
        except OSError as e:
            raise ToolError(f"the workspace directory cannot be opened: {e.strerror}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _file_parts(self, rel: str) -> tuple[str, ...]:
        parts = self.parts(rel)
        if not parts:
            raise ToolError(f"{_show(rel)} is the workspace directory, not a file")
        return parts

    # ----- the file tools -----

    def read_bytes(self, rel: str) -> bytes:
        """The bytes of regular file `rel` (at most `max_file_bytes`), never blocking."""
        parts = self._file_parts(rel)
        lim = self.limits.max_file_bytes
        with self._root_fd() as root:
            try:
                parent, _ = beneath.open_parent(root, parts, create=False)
            except OSError as e:
                raise _failure(rel, e) from None
        try:
            _check_regular(rel, parent, parts[-1], must_exist=True)
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, dir_fd=parent)
            except OSError as e:
                raise _failure(rel, e) from None
        finally:
            os.close(parent)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped after the check
                raise ToolError(f"{_show(rel)} is not a regular file")
            if st.st_size > lim:
                raise ToolError(f"{_show(rel)} is {st.st_size} bytes; the limit is {lim}")
            chunks, n = [], 0
            while n <= lim:
                chunk = os.read(fd, lim + 1 - n)
                if not chunk:
                    break
                chunks.append(chunk)
                n += len(chunk)
            if n > lim:
                raise ToolError(f"{_show(rel)} is over {lim} bytes")
            return b"".join(chunks)
        except OSError as e:
            raise _failure(rel, e) from None
        finally:
            os.close(fd)

    def read(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8", errors="replace")

    def write(self, rel: str, text: str) -> int:
        """Writes `text` (UTF-8) and returns its size in bytes."""
        return self.write_bytes(rel, text.encode("utf-8", errors="replace"))

    def write_bytes(self, rel: str, data: bytes) -> int:
        """Writes regular file `rel` (making its directories), within the caps; its size."""
        return self._write(rel, data, check_caps=True)

    def _write(self, rel: str, data: bytes, check_caps: bool) -> int:
        """`write_bytes`; without `check_caps` for a copy-back whose final state was checked
        whole (its writes, one at a time, may pass a cap on the way there)."""
        parts = self._file_parts(rel)
        lim = self.limits
        if len(data) > lim.max_file_bytes:
            raise ToolError(f"{len(data)} bytes is over the per-file limit {lim.max_file_bytes}")
        with self._root_fd() as root:
            try:
                parent, made = beneath.open_parent(root, parts, create=True)
            except OSError as e:
                raise _failure(rel, e) from None
            try:
                old = _check_regular(rel, parent, parts[-1], must_exist=False)
                problem = self._caps_problem(root, old, len(data)) if check_caps else None
                if problem is not None:
                    for i in range(made):  # the directories made above, deepest first
                        beneath.remove_beneath(root, parts[:len(parts) - 1 - i])
                    raise ToolError(problem)
                try:
                    fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                                 | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=parent)
                except OSError as e:
                    raise _failure(rel, e) from None
            finally:
                os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped after the check
                raise ToolError(f"{_show(rel)} is not a regular file")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            raise _failure(rel, e) from None
        finally:
            os.close(fd)
        return len(data)

    def _caps_problem(self, root_fd: int, old: int | None, size: int) -> str | None:
        """Why writing `size` bytes over a file of `old` bytes (None: a new file) would break
        the caps, or None."""
        lim = self.limits
        entries, total = self._usage(root_fd)
        if old is None and entries + 1 > lim.max_files:
            return f"the workspace already holds {entries} entries (limit)"
        if total - (old or 0) + size > lim.max_total_bytes:
            return f"the workspace would exceed {lim.max_total_bytes} bytes"
        return None

    def remove(self, rel: str) -> None:
        """Removes file or directory `rel` (and everything in it); gone already is fine."""
        parts = self._file_parts(rel)
        with self._root_fd() as root:
            try:
                beneath.remove_beneath(root, parts)
            except OSError as e:
                raise _failure(rel, e) from None

    def size(self, rel: str) -> int:
        """The size of regular file `rel`, or a ToolError saying why it is not one."""
        parts = self._file_parts(rel)
        with self._root_fd() as root:
            try:
                parent, _ = beneath.open_parent(root, parts, create=False)
            except OSError as e:
                raise _failure(rel, e) from None
        try:
            return _check_regular(rel, parent, parts[-1], must_exist=True)
        finally:
            os.close(parent)

    def exists(self, rel: str) -> bool:
        """Whether `rel` is a regular file the file tools can read."""
        try:
            self.size(rel)
            return True
        except ToolError:
            return False

    def listdir(self, rel: str = ".") -> list[str]:
        """The regular files under `rel` (recursive) that the file tools can name, as
        workspace-relative paths, sorted."""
        parts = () if rel.strip() in ("", ".") else self.parts(rel)
        prefix = "".join(p + "/" for p in parts)
        with self._root_fd() as root:
            try:
                base = beneath.open_beneath(root, parts, os.O_RDONLY | os.O_DIRECTORY) \
                    if parts else os.dup(root)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise ToolError(f"no directory {_show(rel)}") from None
                raise _failure(rel, e) from None
        try:
            out = []
            for sub, st, _ in beneath.walk(base, self.limits.max_depth - len(parts)):
                if stat.S_ISREG(st.st_mode) and self.nameable(prefix + sub):
                    out.append(prefix + sub)
            return sorted(out)
        finally:
            os.close(base)

    def keep_only(self, keys, dirs=()) -> None:
        """Removes every entry that is neither one of the regular files `keys` nor one of the
        directories `dirs` or a directory on the way to one (emptied directories, links,
        FIFOs, ...): a mirror of another workspace holds what it holds, and no leftover counts
        against the entry cap."""
        keep = set(keys)
        dirs = set(dirs)
        dirs |= {k.rsplit("/", i)[0] for k in keep | dirs for i in range(1, k.count("/") + 1)}
        gone: list[str] = []
        with self._root_fd() as root:
            for rel, st, _ in list(beneath.walk(root, self.limits.max_depth)):
                if any(rel.startswith(g + "/") for g in gone):
                    continue
                wanted = rel in dirs if stat.S_ISDIR(st.st_mode) else (
                    rel in keep and stat.S_ISREG(st.st_mode))
                if not wanted:
                    beneath.remove_beneath(root, tuple(rel.split("/")))
                    gone.append(rel)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Every regular file (symlinks, FIFOs, ... skipped): its key -> (mtime in ns, size)."""
        return {k: (mt, size) for k, (kind, mt, size) in self._inventory().items()
                if kind == stat.S_IFREG}

    # ----- usage and the caps -----

    def _inventory(self) -> dict[str, tuple[int, int, int]]:
        """Every entry down to `max_depth`: its key -> (file type, mtime in ns, size)."""
        with self._root_fd() as root:
            return {rel: (stat.S_IFMT(st.st_mode), st.st_mtime_ns, st.st_size)
                    for rel, st, _ in beneath.walk(root, self.limits.max_depth)}

    def _usage(self, root_fd: int) -> tuple[int, int]:
        """(entries of any kind, bytes of regular files) in the workspace."""
        entries = total = 0
        for _, st, _ in beneath.walk(root_fd, self.limits.max_depth):
            entries += 1
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
        return entries, total

    def caps_broken(self) -> str:
        """Why the workspace is over its caps ("" when it is not); stops at the first excess, so
        it costs at most `max_files` lookups however many entries a program made."""
        lim = self.limits
        entries = total = 0
        with self._root_fd() as root:
            for _, st, depth in beneath.walk(root, lim.max_depth):
                entries += 1
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
                if entries > lim.max_files:
                    return f"over {lim.max_files} entries"
                if total > lim.max_total_bytes:
                    return f"over {lim.max_total_bytes} bytes"
                if depth == lim.max_depth and stat.S_ISDIR(st.st_mode):
                    return f"directories over {lim.max_depth} levels deep"
        return ""

    def _remove_changes(self, before: dict[str, tuple[int, int, int]]) -> None:
        """Removes every entry not in `before` and every non-directory that changed."""
        gone: list[str] = []
        with self._root_fd() as root:
            for rel, st, _ in list(beneath.walk(root, self.limits.max_depth)):
                if any(rel.startswith(g + "/") for g in gone):
                    continue
                old = before.get(rel)
                now = (stat.S_IFMT(st.st_mode), st.st_mtime_ns, st.st_size)
                if old is None or (old != now and not stat.S_ISDIR(st.st_mode)) \
                        or old[0] != now[0]:
                    beneath.remove_beneath(root, tuple(rel.split("/")))
                    gone.append(rel)

    # ----- running code -----

    def run_python(self, rel: str, args: tuple[str, ...] = ()) -> RunResult:
        """Runs a workspace Python file in the sandbox (module docstring, `sandbox.py`)."""
        self.size(rel)  # a regular file, or the tool error saying why not
        _check_args(args)
        key = self.key(rel)
        if sandbox.layers().bubblewrap:
            raw = sandbox.run_bwrap(self, key, args)
            changed, stderr = (), raw.stderr
            if raw.files is not None:
                try:
                    changed = self._apply(raw.files)
                except ToolError as e:  # the machine's disk, not a name: the output stays
                    stderr += f"\n(the workspace could not take the program's files: {e})"
            return RunResult(raw.returncode, raw.stdout, stderr, raw.duration_s,
                             raw.timed_out, changed, raw.caps_broken)
        before = self._inventory()
        raw = sandbox.run_direct(self, key, args, self.caps_broken)
        if raw.caps_broken:
            self._remove_changes(before)
        after = self.snapshot()
        changed = tuple(k for k, v in after.items()
                        if (before.get(k) or (0,))[1:] != v and self.nameable(k))
        return RunResult(raw.returncode, raw.stdout, raw.stderr, raw.duration_s,
                         raw.timed_out, changed, raw.caps_broken)

    def tree(self) -> tuple[list[str], list[str]]:
        """(directories, regular files) the tools can name, each sorted (a sandbox's copy)."""
        dirs, files = [], []
        with self._root_fd() as root:
            for rel, st, _ in beneath.walk(root, self.limits.max_depth):
                if stat.S_ISDIR(st.st_mode) and self.nameable(rel):
                    dirs.append(rel)
                elif stat.S_ISREG(st.st_mode) and self.nameable(rel):
                    files.append(rel)
        return sorted(dirs), sorted(files)

    def make_dirs(self, rel: str) -> None:
        """Directory `rel` and those above it (no link followed)."""
        parts = self._file_parts(rel)
        with self._root_fd() as root:
            try:
                fd, _ = beneath.open_parent(root, (*parts, "."), create=True)
            except OSError as e:
                raise _failure(rel, e) from None
            os.close(fd)

    def _apply(self, found) -> tuple[str, ...]:
        """Makes the workspace hold what a sandboxed run left (its directories and regular
        files, `sandbox.RawRun.files`); returns the files whose bytes changed. Every name is
        checked before anything changes, by the rule the file tools apply (`nameable`): a
        name they cannot name as itself, or a path past `max_depth`, stays behind. The caps
        need no check here: the sandbox held the run's whole workspace to them, and this is
        a part of it; so the files are written without the per-write check, which an order of
        writes could trip on the way to a final state within the caps."""
        dirs, files = set(), {}
        for kind, name, data in found:
            rel = os.fsdecode(name)
            if not self.nameable(rel):
                continue
            if kind == b"D":
                dirs.add(rel)
            else:
                files[rel] = data
        self.keep_only(files, dirs)
        for d in sorted(dirs):
            self.make_dirs(d)
        changed = []
        for rel, data in files.items():
            try:
                same = self.size(rel) == len(data) and self.read_bytes(rel) == data
            except ToolError:
                same = False
            if not same:
                self._write(rel, data, check_caps=False)
                changed.append(rel)
        return tuple(sorted(changed))

    def nameable(self, key: str) -> bool:
        """Whether the file tools accept `key` as this very entry (the one rule of names: a
        name a program made may be too long or too deep, blank, hold a control character, or
        a backslash, which the tools read as a separator)."""
        try:
            return self.key(key) == key
        except ToolError:
            return False


def _show(rel: str) -> str:
    """A path for an error message: its repr, cut to 80 characters."""
    return repr(rel) if len(rel) <= 80 else repr(rel[:80]) + "..."


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link (links are not followed)",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device"}
_ERRORS = {
    errno.ELOOP: "goes through a symbolic link (links are not followed)",
    errno.EXDEV: "leaves the workspace", errno.ENOTDIR: "has a component that is not a directory",
    errno.EISDIR: "is a directory", errno.ENXIO: "is not a regular file",
    errno.ENAMETOOLONG: "is too long", errno.EACCES: "is not accessible",
    errno.EPERM: "is not accessible", errno.ENOSPC: "cannot be written: the disk is full",
    errno.EFBIG: "cannot be written: too large", errno.EMLINK: "has too many entries",
}


def _failure(rel: str, e: OSError) -> ToolError:
    """The tool error for a failed system call on `rel`."""
    if e.errno == errno.ENOENT:
        return ToolError(f"no file {_show(rel)}")
    why = _ERRORS.get(e.errno, e.strerror or f"errno {e.errno}")
    return ToolError(f"path {_show(rel)} {why}")


def _check_regular(rel: str, parent_fd: int, name: str, must_exist: bool) -> int | None:
    """The size of regular file `name` in `parent_fd` (None if missing and not `must_exist`);
    a ToolError for anything else (checked before opening, so no FIFO or device is opened)."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        if must_exist:
            raise ToolError(f"no file {_show(rel)}") from None
        return None
    except OSError as e:
        raise _failure(rel, e) from None
    kind = stat.S_IFMT(st.st_mode)
    if kind != stat.S_IFREG:
        raise ToolError(f"{_show(rel)} is {_KINDS.get(kind, 'not a regular file')}")
    return st.st_size


def _check_args(args) -> None:
    """Program arguments: strings without NUL bytes or lone surrogates, bounded in size."""
    if len(args) > MAX_ARGS:
        raise ToolError(f"{len(args)} arguments; the limit is {MAX_ARGS}")
    size = 0
    for a in args:
        if not isinstance(a, str):
            raise ToolError("args must be a list of strings")
        if "\x00" in a:
            raise ToolError("an argument contains a NUL byte")
        try:
            size += len(a.encode("utf-8")) + 1
        except UnicodeEncodeError:
            raise ToolError(f"argument {_show(a)} is not valid text (a lone surrogate)") from None
    if size > MAX_ARGS_BYTES:
        raise ToolError(f"the arguments are {size} bytes; the limit is {MAX_ARGS_BYTES}")
