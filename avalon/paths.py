"""The one path layer for what a run writes: local directories and remote URLs alike.

A run directory may be `runs/toy` or `gs://bucket/super`. `pathlib.Path(...).absolute()` and
`os.path` turn the URL into a local path (`/cwd/gs:/bucket/super`), so a preempted pod run would
write, and then look for, its checkpoints on the dead host's disk. Every path the trainer writes
(checkpoints, metrics.jsonl, TensorBoard, plots, events, config and summary files) is built
here, as an `etils.epath.Path` (the path type orbax itself reads and writes through): a URL stays
a URL and goes to its filesystem (GCS through fsspec's `gcsfs`), a local path is made absolute.

Object stores have no append and no atomic rename of a file in place; `append_text` and
`replace_text` do what they mean on both kinds (on a remote path, a whole-object rewrite).
"""

from __future__ import annotations

import os

from etils import epath

# The URL schemes `etils.epath` keeps as URLs (and hands to fsspec).
REMOTE_SCHEMES = ("gs://", "s3://", "az://", "hf://")

PathLike = str | os.PathLike


def is_remote(p: PathLike) -> bool:
    """True for a URL of a remote filesystem (gs://, s3://, az://, hf://)."""
    return os.fspath(p).startswith(REMOTE_SCHEMES)


def path(p: PathLike) -> epath.Path:
    """`p` as an epath.Path: a remote URL kept exactly, a local path made absolute."""
    if isinstance(p, epath.Path) and (is_remote(p) or p.is_absolute()):
        return p
    s = os.fspath(p)
    if "://" in s and not is_remote(s):
        raise ValueError(f"{s!r}: unknown URL scheme; a run directory is a local path or one "
                         f"of {', '.join(REMOTE_SCHEMES)}")
    return epath.Path(s if is_remote(s) else os.path.abspath(s))


def join(base: PathLike, *parts: str) -> epath.Path:
    """base / parts..., kept remote when `base` is."""
    out = path(base)
    for part in parts:
        out = out / part
    return out


def append_text(p: PathLike, text: str) -> None:
    """Append `text` to the file (created if missing). Remote: the object is rewritten whole
    (object stores cannot append), which suits small, infrequently written logs."""
    p = path(p)
    if not is_remote(p):
        with open(os.fspath(p), "a") as f:
            f.write(text)
            f.flush()
        return
    old = p.read_text() if p.exists() else ""
    p.write_text(old + text)


def replace_text(p: PathLike, text: str) -> None:
    """Write the file whole: locally through a temporary file and an atomic rename (a kill
    leaves the old or the new file, never half of one); remotely by one object write, which
    object stores make atomic themselves."""
    p = path(p)
    if is_remote(p):
        p.write_text(text)
        return
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    os.replace(os.fspath(tmp), os.fspath(p))
