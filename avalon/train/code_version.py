"""The code a run runs: the git commit of the checkout Avalon was imported from, and whether
that checkout had uncommitted changes to tracked files.

`code_version()` is recorded at every start of a run (fresh or resumed) in
`WORKDIR/config_history.jsonl` and in `summary.json`, so the report can name the commit
(`avalon.analyze`). Without a checkout to ask (Avalon installed as a package, or no `git`
program) the record says so (`commit: null` and `why`) instead of failing the run.
"""

from __future__ import annotations

import os
import subprocess

import avalon

GIT_TIMEOUT_S = 20  # `git status` on a large tree under load; a run never waits longer


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          check=True, timeout=GIT_TIMEOUT_S).stdout.strip()


def code_version(package_dir: str | None = None) -> dict:
    """{"commit": SHA, "dirty": bool, "version": ...}, or {"commit": None, "why": ...} when the
    package at `package_dir` (default: the imported `avalon`) is not a git checkout's."""
    package_dir = os.path.realpath(package_dir or os.path.dirname(avalon.__file__))
    root = os.path.dirname(package_dir)
    out: dict = {"version": avalon.__version__}
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        # A virtual environment inside some repository is not that repository's code.
        if os.path.realpath(top) != root:
            raise subprocess.CalledProcessError(1, "git")
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except FileNotFoundError:
        return {**out, "commit": None, "why": "git is not installed, so the commit of "
                                               f"{package_dir} is unknown"}
    except subprocess.CalledProcessError:
        return {**out, "commit": None, "why": f"{package_dir} is not in a git checkout "
                                               "(an installed package)"}
    except subprocess.TimeoutExpired:
        return {**out, "commit": None, "why": f"git did not answer in {GIT_TIMEOUT_S} s"}
    return {**out, "commit": commit, "dirty": dirty}


def describe(code: dict | None) -> str:
    """`9f91d94c1a2b`, `9f91d94c1a2b with uncommitted changes`, or '' when none is known."""
    if not code or not code.get("commit"):
        return ""
    return code["commit"][:12] + (" with uncommitted changes" if code.get("dirty") else "")
