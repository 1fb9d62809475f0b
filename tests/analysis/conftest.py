"""One toy smoke run (`configs/toy_org.py:smoke`) per session, for the slow report tests."""

import os
import subprocess
import sys

import pytest

from tests.train.runner import CACHE, REPO, environment


@pytest.fixture(scope="session")
def toy_smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("toy_smoke")
    r = subprocess.run([sys.executable, "-m", "avalon.main",
                        "--config=configs/toy_org.py:smoke", f"--workdir={workdir}",
                        f"--jax_cache_dir={CACHE}"], cwd=REPO, env=environment(),
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    assert os.path.isdir(workdir / "events" / "eval")
    return workdir
