"""Run a sweep: its runs one after another on this machine, or their pod launch commands.

    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py --workdir=runs/budget
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py:smoke --workdir=/tmp/b
    python -m experiments.sweeps.run --sweep=experiments/sweeps/time_budget.py \\
        --workdir=gs://bucket/sweeps/time --print        # launch/run_pod.sh commands, one a run

Each run is `python -m avalon.main` in `WORKDIR/RUN_NAME` (see `sweep.py`), so rerunning the
sweep resumes unfinished runs and skips finished ones; a failed run is recorded and the sweep
goes on; the sweep exits 1 at the end when any run failed. At the end (and with `--table_only`,
from whatever the run directories hold) it writes `WORKDIR/sweep.csv`, `sweep.md` and
`sweep.png` (`table.py`). Ctrl-C stops the running run (which checkpoints) and says which run
the sweep stopped in; rerunning resumes. `--set=a.b=v` (repeatable) adds
an override to every run, e.g. to shrink a smoke sweep further.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from absl import app, flags

from avalon import command
from experiments.sweeps import sweep as sweeps
from experiments.sweeps import table

# Required flags are checked in main, not at definition: tests import `run_sweep` from here,
# and a required flag registered at import fails every other absl parse in that process.
_SWEEP = flags.DEFINE_string("sweep", None, "sweep file, optionally with :arg (required)")
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of the sweep's runs (required)")
_PRINT = flags.DEFINE_bool("print", False, "print the pod launch commands instead of running")
_TABLE_ONLY = flags.DEFINE_bool("table_only", False, "only write the table and plot")
_SET = flags.DEFINE_multi_string("set", [], "a.b=v override added to every run")
PROG = "experiments.sweeps.run"
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "passed to every run (a persistent "
                             "compilation cache: the runs share most programs)")


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: which run it stopped in."""

    def __init__(self, index: int, total: int, name: str):
        super().__init__(f"stopped in run {index}/{total} ({name}); rerun the same command to "
                         "resume (finished runs are skipped, this one resumes)")


def run_sweep(sweep: sweeps.Sweep, workdir: str, extra: list[str] = (), *,
              stream=sys.stderr, cwd: str | None = None) -> list[str]:
    """Every run in turn (resumable), from `cwd` (the repository: config paths are relative);
    then the table and plot. Returns the files written; `failed_runs` names the runs that
    failed (the command line exits non-zero then)."""
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
        rc = _run_child([sys.executable, *cmd[1:]], cwd, i + 1, len(sweep.runs), name)
        status[name] = rc
        with open(status_path, "w") as f:
            json.dump(status, f, indent=1, sort_keys=True)
        if rc:
            stream.write(f"sweep: {name} failed (exit code {rc}); going on\n")
    return table.write_all(sweep, workdir)


def _run_child(cmd: list[str], cwd: str | None, index: int, total: int, name: str) -> int:
    """The run's exit code. Ctrl-C reaches the run too (one process group): it checkpoints and
    says where it stopped, and the sweep waits for that before saying where the sweep stopped
    (`subprocess.run` would kill the run 0.25 s after Ctrl-C)."""
    child = subprocess.Popen(cmd, cwd=cwd)
    try:
        rc = child.wait()
    except KeyboardInterrupt:
        try:
            try:
                child.wait(timeout=2)
            except subprocess.TimeoutExpired:  # the signal came to the sweep alone: pass it on
                child.send_signal(signal.SIGINT)
                child.wait()
        except KeyboardInterrupt:  # a second Ctrl-C: stop the run now
            child.kill()
            child.wait()
        raise SweepInterrupted(index, total, name) from None
    if rc in (130, -signal.SIGINT):  # the run was stopped by a Ctrl-C the sweep did not see
        raise SweepInterrupted(index, total, name)
    return rc


def failed_runs(sweep: sweeps.Sweep, workdir: str) -> list[str]:
    """The runs whose last attempt exited non-zero (WORKDIR/sweep_status.json)."""
    path = os.path.join(workdir, table.STATUS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        status = json.load(f)
    return [n for n in (sweeps.run_name(sweep, r) for r in sweep.runs) if status.get(n)]


def main(argv):
    del argv  # absl_flags_parser refuses extra arguments
    for name, flag in (("sweep", _SWEEP), ("workdir", _WORKDIR)):
        if flag.value is None:
            raise command.Stop(f"--{name}: required (see --help)")
    sweep = sweeps.load(_SWEEP.value)
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
    failed = failed_runs(sweep, _WORKDIR.value)
    if failed:
        sys.stderr.write(f"{PROG}: {len(failed)} of {len(sweep.runs)} runs failed "
                         f"({', '.join(failed)}; their output is above); rerun the same "
                         "command to retry them\n")
        raise SystemExit(1)


def _interrupted() -> str:
    return str(_stopped[0]) if _stopped else "stopped; rerun the same command to resume"


_stopped: list[SweepInterrupted] = []


def _body():
    try:
        app.run(main, flags_parser=command.absl_flags_parser())
    except SweepInterrupted as e:
        _stopped.append(e)
        raise


if __name__ == "__main__":
    command.run(PROG, _body, interrupted=_interrupted)
