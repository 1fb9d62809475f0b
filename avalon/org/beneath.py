"""Opening, listing and removing paths beneath a directory descriptor without following links.

The trainer works on workspaces that sandboxed code can change at any moment (and, through the
HTTP environments, concurrently), so every operation here goes by descriptors, never by
checking a path and then using it:
- `open_beneath(root_fd, parts, flags)`: one `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
  RESOLVE_NO_MAGICLINKS)` where the kernel has it (Linux >= 5.6), else a walk that opens each
  component relative to the previous one with `O_NOFOLLOW | O_DIRECTORY`. Either way a symlink
  anywhere on the path is an error (ELOOP), whatever is swapped meanwhile;
- `open_parent(root_fd, parts, create)`: the descriptor of the directory holding the last
  component (`open_beneath`, or the walk making missing directories with `mkdirat`);
- `walk(root_fd, max_depth)`: every entry beneath, with its `lstat`, from directory
  descriptors (no path length limit, no recursion, at most `max_depth + 1` descriptors open);
- `clear_dir(dir_fd)`: removes everything inside a directory of any depth with two descriptors
  open, by hoisting each subdirectory's entries into its parent before removing it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from collections.abc import Iterator, Sequence

SYS_OPENAT2 = 437  # the unified syscall table (x86-64, arm64, ...)
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


@functools.cache
def _syscall():
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return fn


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel has openat2 (probed once, on the filesystem root)."""
    fd = _openat2(-100, b"/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0, 0)
    if fd >= 0:
        os.close(fd)
        return True
    return False


def _openat2(dir_fd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    """The raw call: a descriptor, or -errno."""
    how = _OpenHow(flags, mode, resolve)
    fd = _syscall()(SYS_OPENAT2, ctypes.c_int(dir_fd), ctypes.c_char_p(path), ctypes.byref(how),
                    ctypes.c_size_t(ctypes.sizeof(how)))
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def _open_dir(name: str, dir_fd: int, flags: int = DIR_FLAGS) -> int:
    """Subdirectory `name` of `dir_fd`; a symlink there is ELOOP (as openat2 says), not ENOTDIR."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except NotADirectoryError:
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _walk_open(root_fd: int, parts: Sequence[str], flags: int, mode: int) -> int:
    fd = root_fd
    try:
        for part in parts[:-1]:
            nxt = _open_dir(part, fd)
            if fd != root_fd:
                os.close(fd)
            fd = nxt
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
        if flags & os.O_DIRECTORY:
            return _open_dir(parts[-1], fd, flags)
        return os.open(parts[-1], flags, mode, dir_fd=fd)
    finally:
        if fd != root_fd:
            os.close(fd)


def open_beneath(root_fd: int, parts: Sequence[str], flags: int, mode: int = 0o644, *,
                 use_openat2: bool | None = None) -> int:
    """A descriptor for root/parts[0]/.../parts[-1], no symlink followed; raises OSError.

    `parts` are plain names (no '', '.', '..', '/'): the caller validates them. `use_openat2`
    None: where the kernel has it (False forces the walk, for tests)."""
    if use_openat2 is None:
        use_openat2 = openat2_available()
    if not use_openat2:
        return _walk_open(root_fd, parts, flags, mode)
    path = os.fsencode("/".join(parts))
    mode = mode if flags & os.O_CREAT else 0  # openat2 refuses a mode it would not use
    fd = _openat2(root_fd, path, flags | os.O_CLOEXEC, mode,
                  RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), "/".join(parts))
    return fd


def open_parent(root_fd: int, parts: Sequence[str], create: bool) -> tuple[int, int]:
    """(a new descriptor of the directory root/parts[:-1], how many directories it made).

    Missing directories are made (`mkdirat`, then opened with O_NOFOLLOW) when `create`;
    otherwise `open_beneath` opens the directory in one step."""
    if not create:
        if len(parts) == 1:
            return os.dup(root_fd), 0
        return open_beneath(root_fd, parts[:-1], os.O_RDONLY | os.O_DIRECTORY), 0
    fd, made = os.dup(root_fd), 0
    try:
        for part in parts[:-1]:
            try:
                nxt = _open_dir(part, fd)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made += 1
                except FileExistsError:
                    pass  # made meanwhile: the open below decides what it is
                nxt = _open_dir(part, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def walk(root_fd: int, max_depth: int) -> Iterator[tuple[str, os.stat_result, int]]:
    """(relative path, lstat, depth) of every entry beneath `root_fd`, depth-first, parents first.

    Depth 1 is a direct child. Directories at depth `max_depth` are yielded but not entered.
    Entries that vanish or cannot be read meanwhile are skipped."""
    stack: list[tuple[int, str, Iterator[str], int]] = []
    fd = os.dup(root_fd)
    try:
        names = _names(fd)
    except OSError:
        os.close(fd)
        return
    stack.append((fd, "", iter(names), 1))
    try:
        while stack:
            fd, prefix, names, depth = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + name
            yield rel, st, depth
            if stat.S_ISDIR(st.st_mode) and depth < max_depth:
                try:
                    sub = open_dir_unlocking(fd, name)
                except OSError:
                    continue
                try:
                    sub_names = _names(sub)
                except OSError:
                    os.close(sub)
                    continue
                stack.append((sub, rel + "/", iter(sub_names), depth + 1))
    finally:
        for fd, *_ in stack:
            os.close(fd)


def _names(dir_fd: int) -> list[str]:
    return sorted(os.listdir(dir_fd))


def remove_beneath(root_fd: int, parts: Sequence[str]) -> None:
    """Removes root/parts, a file or a directory of any depth (gone already is fine)."""
    try:
        parent, _ = open_parent(root_fd, parts, create=False)
    except OSError:
        return
    try:
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            clear_dir(fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def clear_dir(dir_fd: int) -> None:
    """Removes everything inside the directory `dir_fd` (see the module docstring)."""
    hoisted = 0
    while True:
        names = os.listdir(dir_fd)
        if not names:
            return
        for name in names:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dir_fd)
                continue
            # Emptied first, never rmdir'ed full: the kernel walks the subtree of a directory
            # it is asked to remove (shrinking its caches), which over a deep chain is slow.
            sub = open_dir_unlocking(dir_fd, name)
            try:
                for inner in os.listdir(sub):
                    while True:  # a fresh name in the parent (the program may have used some)
                        hoisted += 1
                        try:
                            os.rename(inner, f".avalon-rm-{hoisted}", src_dir_fd=sub,
                                      dst_dir_fd=dir_fd)
                            break
                        except (IsADirectoryError, NotADirectoryError, FileExistsError):
                            continue
                        except OSError as e:
                            if e.errno != errno.ENOTEMPTY:
                                raise
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dir_fd)


def open_dir_unlocking(dir_fd: int, name: str) -> int:
    """Subdirectory `name` (no link followed), made readable and writable first if a program
    had locked it (the trainer owns the workspace; a mode-0 directory must not hide entries)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the directory itself, not a link
        # The magic link names the descriptor's directory itself (no path is looked up again).
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(path_fd)
