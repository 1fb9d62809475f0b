"""What the rest of a run will cost: a forecast of every unit of work still planned.

A training invocation is a sequence of units: the teacher traces, SFT steps, evaluations, RLCR
steps and the finish (the last checkpoint's wait, plots, the summary). The progress line's ETA
sums a forecast of each unit still planned, from its first line on. A unit costs its work plus
what it compiles, and the two are forecast apart because they behave differently:

- Work depends on the machine's speed and the unit's place in the run (RLCR steps lengthen as
  the organisation grows, evaluations are short), not on what was compiled before.
- Compiling happens in a few units only (a phase's first unit builds its programs; a later
  unit meets a new batch shape now and then), and by far the most of it is XLA's backend
  compile, which the persistent compilation cache saves; tracing and lowering run again in
  every process. So a unit's compile is kept as its trace-and-lower part and its backend part
  (`backend_s`), and a unit whose programs an earlier invocation of the same run already put in
  the run's cache is forecast to pay its trace-and-lower part and a cache read only.

Where the forecast comes from, best first:
1. this run's own record, `WORKDIR/progress.jsonl`: every unit every invocation of the run
   timed (never truncated on resume: the units a killed invocation ran after its checkpoint
   still say what they cost, and that their programs are in the cache);
2. the machine's record of earlier runs with the same key (`timing_key`: what fixes the
   programs and their shapes: the config less its counts, the devices, the JAX version), the
   median of the last few invocations, so that one slow run does not set the forecast;
3. the reference shipped with Avalon for its configs (`shipped_record`: the units of a few
   fresh runs of the config on a 2-core CPU, the median of each, recorded by
   `experiments.bench.progress_eta --ship_reference --runs=N`), for the units the machine has
   not timed yet;
4. a guess per phase (`GUESS`), for a config neither ran: the ETA then shows `~`.

Each unit is matched by phase and ordinal (SFT step k, the evaluation at RLCR step k, RLCR step
k), so a compile that came at RLCR step 2 of the reference is expected at step 2 again. The
reference's seconds are then scaled to this invocation's speed once units are timed here, by
the ratio of what they took to what the reference said (work per phase; compiles over all
phases, since compiling speed is the machine's), and at once while a compile runs past its
forecast. Before anything is timed the reference stands as it is: neither a short CPU probe
nor the load average foretold the smoke run's compile times on the shared 2-core machine (a
probe read 2.8x faster at load 7 than at load 2.4, while the SFT compile took the same 36-38 s;
sessions before saw the same compile take 249 s), so the first lines are as good as the
machine's speed now is like the reference's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics

from avalon import paths

RUN_RECORD = "progress.jsonl"  # in the workdir: every unit of every invocation
# The share of a backend compile a cache load costs (reading and deserialising the executable;
# small against XLA's optimisation passes).
CACHE_READ_SHARE = 0.05
# Seconds per unit when neither this run nor the machine has timed a phase: (work, the
# compile of the phase's first unit). Only a fresh config on a fresh machine sees them.
GUESS = {"teacher": (5.0, 0.0), "sft": (5.0, 60.0), "eval": (10.0, 60.0),
         "rl": (20.0, 60.0), "finish": (2.0, 0.0)}
# Phases whose units run the same programs: evaluations and RLCR rollouts both decode on the
# trainer's engine, so whichever runs first in a process builds the engine's programs for both.
FAMILY = {"eval": "engine", "rl": "engine"}
# Scale factors stay within these bounds: one odd unit must not multiply the whole ETA.
FACTOR_RANGE = (0.2, 5.0)
# Config fields that change how many units run, not what one costs (left out of the key).
COUNT_FIELDS = (("sft", "steps"), ("rollout", "steps"), ("rollout", "log_every"),
                ("eval", "every"), ("checkpoint",), ("plots",), ("keep_event_logs",),
                ("init_from",), ("seed",))


@dataclasses.dataclass(frozen=True)
class Timed:
    """One unit as recorded: its phase and ordinal, post-compile seconds, compile seconds (of
    which `backend_s` XLA's backend compile), whether it was its phase's first unit in its
    process, whether its process resumed a run, whether its programs were expected from the
    persistent cache, and the invocation it ran in."""

    phase: str
    ordinal: int | None
    work_s: float
    compile_s: float
    backend_s: float = 0.0
    first: bool = False
    resumed: bool = False
    warm: bool = False
    invocation: str = ""

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Timed | None:
        try:
            return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
        except TypeError:
            return None


def read_record(path) -> list[Timed]:
    """The units a record holds."""
    path = paths.path(path)
    if not path.exists():
        return []
    units = []
    for line in path.read_text().splitlines():
        try:
            t = Timed.from_json(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill: the others stand
        if t is not None:
            units.append(t)
    return units


def append_record(path, line: dict) -> None:
    """Append one line; a record that cannot be written costs the ETA, never the run."""
    try:
        paths.path(path).parent.mkdir(parents=True, exist_ok=True)
        paths.append_text(path, json.dumps(line, sort_keys=True) + "\n")
    except OSError:
        pass


# The shipped references (`shipped_record`), one file per config, named by its key without the
# JAX version (a newer jax compiles the same programs in similar times; the machine's own record
# soon takes over).
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eta_reference")


def shipped_record(description: dict, *, devices: str) -> str:
    """The path of the shipped reference for a config (`description`: what the run writes as
    config.json) on `devices` (may not exist)."""
    return os.path.join(SHIPPED_DIR,
                        timing_key(description, devices=devices, jax_version="any") + ".jsonl")


def ship(run_records, description: dict, *, devices: str) -> str:
    """Write finished fresh runs' units (their `progress.jsonl`s, one invocation each) as the
    shipped reference of their config; returns the path written. The reference forecasts each
    unit by the median over its runs (`Reference`), so one run's odd unit (a finish of 1.8 s
    where others took 0.7-0.9 s) does not set every first-time run's forecast. Refused for a
    resumed run: a reference is an invocation's costs from nothing compiled."""
    if isinstance(run_records, (str, os.PathLike)):
        run_records = [run_records]
    lines = []
    for record in run_records:
        units = read_record(record)
        if not units or len({t.invocation for t in units}) != 1 or any(t.resumed for t in units):
            raise ValueError(f"{record}: not one fresh invocation's units; ship runs that "
                             "each ran from the start to the end in one process")
        lines += [json.dumps(t.as_json(), sort_keys=True) + "\n" for t in units]
    path = shipped_record(description, devices=devices)
    os.makedirs(SHIPPED_DIR, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(lines)
    return path


def machine_dir() -> str:
    """Where this machine keeps its runs' unit times: `$AVALON_TIMINGS_DIR`, or
    `~/.cache/avalon/timings`."""
    return os.environ.get("AVALON_TIMINGS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "avalon", "timings")


def timing_key(description: dict, *, devices: str, jax_version: str) -> str:
    """A short hash of what fixes a unit's programs and costs: the described config without
    its counts (a run of 30 RLCR steps costs per step what one of 3 does), the devices and
    the JAX version (another compiler compiles for another time)."""
    d = json.loads(json.dumps(description, sort_keys=True, default=str))
    for field in COUNT_FIELDS:
        node = d
        for name in field[:-1]:
            node = node.get(name, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(field[-1], None)
    text = json.dumps({"config": d, "devices": devices, "jax": jax_version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def device_text(devices, process_count: int) -> str:
    """The devices part of a key: count, kind and processes (`1xcpu/1`)."""
    return f"{len(devices)}x{devices[0].device_kind}/{process_count}"


def clamp(x: float) -> float:
    return min(max(x, FACTOR_RANGE[0]), FACTOR_RANGE[1])


class Reference:
    """Expected seconds per (phase, ordinal), from this run's record (its latest timing of a
    unit wins: the same rollouts, the same machine) over the machine's (the median of the last
    `runs` invocations that timed it) over the shipped reference's (for the units neither
    timed: a run killed on a machine's first try has recorded only its first units)."""

    def __init__(self, own: list[Timed] = (), machine: list[Timed] = (),
                 shipped: list[Timed] = (), runs: int = 3):
        self.work: dict[tuple[str, int | None], float] = {}
        self.cold: dict[tuple[str, int | None], tuple[float, float]] = {}  # (compile, backend)
        self.first_ordinal: dict[str, int] = {}
        for source, median in ((shipped, True), (machine, True), (own, False)):
            work, cold = _samples(source, runs)
            pick = statistics.median if median else (lambda xs: xs[-1])
            self.work |= {k: pick(v) for k, v in work.items()}
            self.cold |= {k: (pick([c for c, _ in v]), pick([b for _, b in v]))
                          for k, v in cold.items()}
        for phase, ordinal in list(self.work) + list(self.cold):
            if ordinal is not None:
                self.first_ordinal[phase] = min(self.first_ordinal.get(phase, ordinal), ordinal)

    def phases(self) -> set[str]:
        return {p for p, _ in self.work}

    def work_of(self, phase: str, ordinal: int | None) -> float | None:
        """The work of (phase, ordinal); an ordinal never timed: the phase's mean."""
        if (phase, ordinal) in self.work:
            return self.work[phase, ordinal]
        known = [w for (p, _), w in self.work.items() if p == phase]
        return sum(known) / len(known) if known else None

    def cold_of(self, phase: str, ordinal: int | None) -> tuple[float, float] | None:
        """(compile, backend) seconds of (phase, ordinal) with nothing in the cache. An ordinal
        never timed past the phase's first: the nearest timed one's, halved for each ordinal
        between (new shapes grow rarer as a run goes on, and a run longer than its reference
        must not expect every later step to compile as much as the reference's last did)."""
        if (phase, ordinal) in self.cold:
            return self.cold[phase, ordinal]
        first = self.first_ordinal.get(phase)
        later = [(o, c) for (p, o), c in self.cold.items()
                 if p == phase and o is not None and o != first]
        if ordinal is None or ordinal == first or not later:
            return None
        o, (compiled, backend) = min(later, key=lambda oc: abs(oc[0] - ordinal))
        share = 0.5 ** abs(o - ordinal)
        return compiled * share, backend * share


def _samples(units: list[Timed], runs: int):
    """Per (phase, ordinal): the work seconds and the (compile, backend) seconds of the latest
    `runs` invocations, oldest first. A compile counts only where nothing came from the cache
    and the unit compiled what its ordinal needs and no more (a resumed process's first unit
    of a phase past the phase's first ordinal also builds the phase's programs)."""
    work: dict = {}
    cold: dict = {}
    starts: dict = {}
    for t in units:
        if t.ordinal is not None:
            starts[t.phase] = min(starts.get(t.phase, t.ordinal), t.ordinal)
    for t in units:
        key = (t.phase, t.ordinal)
        work.setdefault(key, []).append((t.invocation, t.work_s))
        if not t.warm and not (t.first and t.resumed and t.ordinal != starts.get(t.phase)):
            cold.setdefault(key, []).append((t.invocation, (t.compile_s, t.backend_s)))

    def last(pairs):
        by_run: dict = {}
        for run, value in pairs:
            by_run[run] = value  # the latest of an invocation (a unit timed twice: resumed)
        return list(by_run.values())[-runs:]
    return {k: last(v) for k, v in work.items()}, {k: last(v) for k, v in cold.items()}
