"""Runs `python -m avalon.main` on the micro config in a subprocess (shared compile cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("AVALON_TEST_JAX_CACHE",
                       os.path.join(tempfile.gettempdir(), "avalon-test-jax-cache"))


def main_command(workdir, *extra) -> list[str]:
    return [sys.executable, "-m", "avalon.main", "--config=tests/train/micro_config.py",
            f"--workdir={workdir}", f"--jax_cache_dir={CACHE}", *extra]


def environment() -> dict:
    # XLA_FLAGS (optimisation level) comes from the test process, so cache keys match.
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def start_main(workdir, *extra, stderr=subprocess.PIPE) -> subprocess.Popen:
    """Starts `avalon.main` in the background (stdout discarded; stderr as given)."""
    return subprocess.Popen(main_command(workdir, *extra), cwd=REPO, env=environment(),
                            stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def run_main(workdir, *extra, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run(main_command(workdir, *extra), cwd=REPO, env=environment(),
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"avalon.main failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r


def metrics(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def deterministic(record: dict) -> dict:
    """A metrics record without the fields that measure time or the host process (progress/:
    the wall-clock seconds of the run's work and compiles)."""
    return {k: v for k, v in record.items()
            if not k.startswith(("time/", "perf/", "host/", "progress/"))}
