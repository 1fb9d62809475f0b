"""Where a server keeps its sessions' directories, and what it does with a dead server's.

Each server makes one root, `<tmp>/avalon-sessions-<random>-<pid>/`, holds an exclusive `flock`
on its `lock` file for its whole life, and makes every session's directory inside it. A server
killed with SIGKILL cannot remove its root, but the kernel drops its lock: so each server, when
it starts, removes every `avalon-sessions-*` root whose lock nobody holds (one that a live
server is still setting up has its lock taken before anything else). Roots of live servers,
on this machine or sharing the directory, are left alone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

PREFIX = "avalon-sessions-"


class SessionDirs:
    """This server's root of session directories (module docstring)."""

    def __init__(self, parent: str | None = None):
        self.parent = parent or tempfile.gettempdir()
        # Made under another name, locked, then renamed: no other server ever sees the root
        # unlocked (the lock is on the file, so it survives the rename).
        making = tempfile.mkdtemp(prefix=f".making-{PREFIX}", dir=self.parent)
        self._lock = os.open(os.path.join(making, "lock"),
                             os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.root = os.path.join(self.parent, PREFIX + os.path.basename(making).removeprefix(
            f".making-{PREFIX}") + f"-{os.getpid()}")
        os.rename(making, self.root)
        self.removed = remove_stale(self.parent)

    def new(self) -> str:
        """A fresh directory for one session."""
        return tempfile.mkdtemp(prefix="session-", dir=self.root)

    def close(self) -> None:
        """Removes the root and every session directory in it."""
        if self._lock >= 0:
            shutil.rmtree(self.root, ignore_errors=True)
            os.close(self._lock)
            self._lock = -1


def remove_stale(parent: str) -> list[str]:
    """Removes the roots in `parent` whose lock no live server holds; returns them."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        root = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # being made right now (the lock comes first) or being removed
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live server's
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
        finally:
            os.close(fd)
    return removed
