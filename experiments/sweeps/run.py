"""Run a sweep: its runs one after another on this machine, or their pod launch commands.

    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py --workdir=runs/budget
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py:smoke --workdir=/tmp/b
    python -m experiments.sweeps.run --sweep=experiments/sweeps/time_budget.py \\
        --workdir=gs://bucket/sweeps/time --print        # launch/run_pod.sh commands, one a run

Each run is `python -m avalon.main` in `WORKDIR/RUN_NAME` (see `sweep.py`), so rerunning the
sweep resumes unfinished runs and skips finished ones; a failed run is recorded and the sweep
goes on. At the end (and with `--table_only`, from whatever the run directories hold) it writes
`WORKDIR/sweep.csv`, `sweep.md` and `sweep.png` (`table.py`). `--set=a.b=v` (repeatable) adds
an override to every run, e.g. to shrink a smoke sweep further.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

from experiments.sweeps import sweep as sweeps
from experiments.sweeps import table

# Required flags are checked in main, not at definition: tests import `run_sweep` from here,
# and a required flag registered at import fails every other absl parse in that process.
_SWEEP = flags.DEFINE_string("sweep", None, "sweep file, optionally with :arg (required)")
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of the sweep's runs (required)")
_PRINT = flags.DEFINE_bool("print", False, "print the pod launch commands instead of running")
_TABLE_ONLY = flags.DEFINE_bool("table_only", False, "only write the table and plot")
_SET = flags.DEFINE_multi_string("set", [], "a.b=v override added to every run")
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "passed to every run (a persistent "
                             "compilation cache: the runs share most programs)")


def run_sweep(sweep: sweeps.Sweep, workdir: str, extra: list[str] = (), *,
              stream=sys.stderr, cwd: str | None = None) -> list[str]:
    """Every run in turn (resumable), from `cwd` (the repository: config paths are relative);
    then the table and plot. Returns the files written."""
    os.makedirs(workdir, exist_ok=True)
    status_path = os.path.join(workdir, table.STATUS_FILE)
    status = {}
    if os.path.exists(status_path):
        with open(status_path) as f:
            status = json.load(f)
    for i, run in enumerate(sweep.runs):
        name = sweeps.run_name(sweep, run)
        cmd = sweeps.main_command(sweep, run, workdir, extra)
        stream.write(f"sweep: run {i + 1}/{len(sweep.runs)} {name}\n")
        stream.flush()
        rc = subprocess.run([sys.executable, *cmd[1:]], cwd=cwd).returncode
        status[name] = rc
        with open(status_path, "w") as f:
            json.dump(status, f, indent=1, sort_keys=True)
        if rc:
            stream.write(f"sweep: {name} failed (exit code {rc}); going on\n")
    return table.write_all(sweep, workdir)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for name, flag in (("sweep", _SWEEP), ("workdir", _WORKDIR)):
        if flag.value is None:
            raise app.UsageError(f"--{name} is required")
    try:
        sweep = sweeps.load(_SWEEP.value)
    except ValueError as e:
        sys.exit(f"experiments.sweeps.run: {e}")
    extra = [f"--config.{s}" for s in _SET.value]
    if _CACHE.value:
        extra.append(f"--jax_cache_dir={_CACHE.value}")
    if _PRINT.value:
        for run in sweep.runs:
            print(sweeps.pod_command(sweep, run, _WORKDIR.value, extra))
        return
    if _TABLE_ONLY.value:
        paths = table.write_all(sweep, _WORKDIR.value)
    else:
        paths = run_sweep(sweep, _WORKDIR.value, extra)
    print(table.markdown(table.collect(sweep, _WORKDIR.value)), end="")
    print("sweep: wrote " + ", ".join(paths))


if __name__ == "__main__":
    app.run(main)
