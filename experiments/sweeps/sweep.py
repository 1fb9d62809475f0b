"""A sweep declared as code beside a config (big_vision style), and its expansion into runs.

A sweep file (`experiments/sweeps/NAME.py`) defines `get_sweep(arg: str = "") -> Sweep`: the
config file (with its own `:arg`), the runs (a list of `{"a.b": value}` override dicts, built
by hand or with `grid`), the swept field the plot puts on its x axis, and the overrides every
run shares. Each run becomes one `python -m avalon.main --config=FILE --workdir=DIR/NAME
--config.a.b=value ...` command, named by its x value (or, when x repeats, by its values of
every varying field).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import re
import shlex
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Sweep:
    config: str  # a config file, optionally with `:arg` (e.g. "configs/toy_org.py:smoke")
    runs: tuple[Mapping[str, object], ...]  # each run's `--config.` overrides
    x: str  # the field the sweep plot puts on its x axis (a key of every run)
    shared: Mapping[str, object] = dataclasses.field(default_factory=dict)  # on every run

    def __post_init__(self):
        if not self.runs:
            raise ValueError("Sweep.runs is empty")
        for i, run in enumerate(self.runs):
            if self.x not in run:
                raise ValueError(f"Sweep.runs[{i}]={dict(run)!r} does not set x={self.x!r}")
        names = [run_name(self, r) for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"Sweep.runs repeat: {names}")

    @property
    def varying(self) -> list[str]:
        """The fields whose value differs between runs (the table's columns), x first."""
        keys = sorted({k for r in self.runs for k in r})
        vary = [k for k in keys if len({repr(r.get(k)) for r in self.runs}) > 1]
        return [self.x] + [k for k in vary if k != self.x]


def grid(**axes: Sequence) -> list[dict[str, object]]:
    """Every combination: `grid(**{"rl.lr": [1e-4, 3e-4], "seed": [0, 1]})` -> 4 override
    dicts (keyword names are config paths, so pass them through a dict)."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def smoke_and_source(arg: str, what: str) -> tuple[bool, str]:
    """A sweep file's argument, `smoke`, `from=RUN_DIR` or both (`smoke,from=RUN_DIR`):
    (smoke, RUN_DIR or "")."""
    parts = [p for p in arg.split(",") if p]
    sources = [p.removeprefix("from=") for p in parts if p.startswith("from=")]
    unknown = [p for p in parts if p != "smoke" and not p.startswith("from=")]
    if unknown or len(sources) > 1 or (sources and not sources[0]):
        raise ValueError(f"{what} argument {arg!r}: takes 'smoke', 'from=RUN_DIR' or both "
                         "('smoke,from=RUN_DIR')")
    return "smoke" in parts, (sources[0] if sources else "")


# Every run of a sweep's `from=RUN` form: RUN's params, evaluated once, nothing trained.
def evaluation_only(run_dir: str) -> dict[str, object]:
    return {"init_from": run_dir, "sft.steps": 0, "rollout.steps": 0}


def flag_value(value) -> str:
    """A Python value as an absl `--config.x=` flag value."""
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(flag_value(v) for v in value) + ("," if len(value) == 1 else "") \
            + ")"
    return str(value)


def run_name(sweep: Sweep, run: Mapping[str, object]) -> str:
    """`eval.budget=3`: the x field when it tells the runs apart, else every field that
    varies; safe as a directory name."""
    if len({repr(r[sweep.x]) for r in sweep.runs}) == len(sweep.runs):
        keys = [sweep.x]
    else:
        keys = [k for k in sweep.varying if k in run] or sorted(run)
    name = ",".join(f"{k}={flag_value(run[k])}" for k in keys)
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", name)


def overrides(sweep: Sweep, run: Mapping[str, object]) -> list[str]:
    return [f"--config.{k}={flag_value(v)}" for k, v in {**sweep.shared, **run}.items()]


def main_command(sweep: Sweep, run: Mapping[str, object], workdir: str,
                 extra: Sequence[str] = ()) -> list[str]:
    """The `python -m avalon.main` command of one run, here."""
    return ["python", "-m", "avalon.main", f"--config={sweep.config}",
            f"--workdir={os.path.join(workdir, run_name(sweep, run))}",
            *overrides(sweep, run), *extra]


def pod_command(sweep: Sweep, run: Mapping[str, object], workdir: str,
                extra: Sequence[str] = ()) -> str:
    """The `launch/run_pod.sh` command of one run (see launch/README.md)."""
    return shlex.join(["launch/run_pod.sh", sweep.config,
                       os.path.join(workdir, run_name(sweep, run)), *overrides(sweep, run),
                       *extra])


def load(spec: str) -> Sweep:
    """`experiments/sweeps/NAME.py[:arg]` -> its `get_sweep(arg)`."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise ValueError(f"--sweep={spec}: no such sweep file")
    module_spec = importlib.util.spec_from_file_location("avalon_sweep", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"--sweep={spec}: the file defines no get_sweep(arg)")
    sweep = module.get_sweep(arg) if arg else module.get_sweep()
    if not isinstance(sweep, Sweep):
        raise ValueError(f"--sweep={spec}: get_sweep returned {type(sweep).__name__}, not a Sweep")
    return sweep
