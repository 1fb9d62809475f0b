"""The code a run records (`avalon/train/code_version.py`): this checkout's commit as git says
it, and a clear `why` (no crash) for a package outside any checkout or without git."""

import os
import shutil
import subprocess

import avalon
from avalon.train.code_version import code_version, describe

PACKAGE = os.path.dirname(avalon.__file__)


def _git(*args):
    return subprocess.run(["git", "-C", os.path.dirname(PACKAGE), *args], capture_output=True,
                          text=True)


def test_the_checkout_commit_and_its_uncommitted_changes():
    head = _git("rev-parse", "HEAD")
    code = code_version()
    if head.returncode:  # CI may test an exported tree: then the record says why
        assert code["commit"] is None and code["why"]
        return
    assert code["commit"] == head.stdout.strip()
    status = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    assert code["dirty"] is bool(status)
    assert describe(code) == code["commit"][:12] + (" with uncommitted changes"
                                                    if status else "")


def test_an_installed_package_records_why_there_is_no_commit(tmp_path):
    installed = tmp_path / "site-packages" / "avalon"
    installed.mkdir(parents=True)
    shutil.copy(os.path.join(PACKAGE, "__init__.py"), installed / "__init__.py")
    code = code_version(str(installed))
    assert code["commit"] is None and "not in a git checkout" in code["why"]
    assert code["version"] == avalon.__version__ and describe(code) == ""


def test_no_git_program(monkeypatch):
    monkeypatch.setenv("PATH", "")
    code = code_version()
    assert code["commit"] is None and code["why"].startswith("git is not installed")
