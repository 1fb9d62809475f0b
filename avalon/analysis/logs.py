"""Reading a run directory's event logs: every logged rollout with what it was and what it got.

Layout (written by the training driver, `avalon/train/loop.py` and `evaluation.py`):

    WORKDIR/events/<phase>/step<STEP>/group<G>_rollout<I>.jsonl   one event log per rollout
    WORKDIR/events/<phase>/step<STEP>/index*.jsonl                one line per rollout

`phase` is "eval" (held-out evaluations, logged by default) or "rl" (training rollouts, every
`rollout.log_every` RLCR steps). `STEP` is the number of updates behind the policy that played
the rollouts (the global step of `metrics.jsonl`). An index line holds `file` (the event log's
name), `phase`, `step`, `rl_step`, `env` (the environment's name), `arm` ("org", "single", or a
baseline's name) and `extra` (free JSON: a baseline's parameters). Everything else a rollout is
(task, budget, seed, clock cap) is in its `start` event, and its reward is the sum of its
reward events, so the index never disagrees with the log.

    for r in read_run("runs/toy"):
        r.step, r.phase, r.env, r.arm, r.task_id, r.budget, r.reward, r.events
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

from avalon import paths
from avalon.org.events import EventKind, read_jsonl

EVENTS_DIR = "events"
INDEX_GLOB = "index*.jsonl"
_INDEX_KEYS = ("file", "phase", "step", "rl_step", "env", "arm")


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """What the event log of one rollout does not say itself."""

    file: str  # the event log's file name, in the same directory
    phase: str  # "eval" | "rl"
    step: int  # updates behind the policy that played it
    rl_step: int
    env: str
    arm: str  # "org", "single", or a baseline ("s8", "best_of_k", ...)
    extra: Mapping = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in _INDEX_KEYS}, "extra": dict(self.extra)}


def rollout_file(group_id: int, rollout_index: int) -> str:
    """The name `RolloutDriver` gives a rollout's event log (`avalon/org/driver.py`)."""
    return f"group{group_id}_rollout{rollout_index}.jsonl"


def step_dir(workdir: str | os.PathLike, phase: str, step: int) -> str:
    return os.path.join(os.fspath(workdir), EVENTS_DIR, phase, f"step{step}")


def write_index(log_dir: str | os.PathLike, entries: Iterable[IndexEntry], *,
                part: str = "") -> str:
    """Writes `index.jsonl`, or `index-<part>.jsonl` for another writer of the same directory
    (another process's rollouts: "p1", ...; the baselines: "baselines")."""
    name = f"index-{part}.jsonl" if part else "index.jsonl"
    path = paths.join(log_dir, name)  # a local file or a gs:// object
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e.to_json(), sort_keys=True) + "\n" for e in entries),
                    encoding="utf-8")
    return os.fspath(path)


def reward_of(events: Sequence[Mapping]) -> float:
    """The collective reward R_i: every reward event of the log, in time (late ones dropped)."""
    total = 0.0
    for e in events:
        if e["kind"] == EventKind.TOOL_CALL.value and not e.get("late"):
            total += sum(float(r["value"]) for r in e.get("rewards", ()))
        elif e["kind"] == EventKind.END.value:
            total += sum(float(r["value"]) for r in e.get("rewards", ()))
    return total


@dataclasses.dataclass
class LoggedRollout:
    """One rollout read back from a run directory (or from a lone event log)."""

    path: str
    events: list[dict]
    phase: str
    step: int
    rl_step: int
    env: str
    arm: str
    extra: Mapping

    @property
    def start(self) -> dict:
        return self.events[0]

    @property
    def task_id(self) -> str:
        return self.start["task_id"]

    @property
    def budget(self) -> int:
        return int(self.start["budget"])

    @property
    def seed(self) -> int:
        return int(self.start["seed"])

    @property
    def clock_s(self) -> float | None:
        return self.start.get("clock_s")

    @property
    def reward(self) -> float:
        return reward_of(self.events)

    @property
    def end(self) -> dict | None:
        last = self.events[-1]
        return last if last["kind"] == EventKind.END.value else None


def _check_log(path: str, events: list[dict]) -> None:
    if not events:
        raise ValueError(f"{path}: empty event log")
    if events[0]["kind"] != EventKind.START.value:
        raise ValueError(f"{path}: the first event is {events[0]['kind']!r}, not 'start'")


def read_events(path: str | os.PathLike, **meta) -> LoggedRollout:
    """A lone event log as a `LoggedRollout` (phase, step, env, arm from `meta` or unknown)."""
    path = os.fspath(path)
    events = read_jsonl(path)
    _check_log(path, events)
    return LoggedRollout(path=path, events=events, phase=meta.get("phase", ""),
                         step=int(meta.get("step", 0)), rl_step=int(meta.get("rl_step", 0)),
                         env=meta.get("env", ""), arm=meta.get("arm", ""),
                         extra=meta.get("extra", {}))


def read_index(log_dir: str) -> list[IndexEntry]:
    entries = []
    paths = sorted(glob.glob(os.path.join(log_dir, INDEX_GLOB)),
                   key=lambda p: (os.path.basename(p) != "index.jsonl", p))  # the main one first
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                missing = [k for k in _INDEX_KEYS if k not in row]
                if missing:
                    raise ValueError(f"{path}:{n}: index line lacks {missing}")
                entries.append(IndexEntry(**{k: row[k] for k in _INDEX_KEYS},
                                          extra=row.get("extra", {})))
    return entries


def read_run(workdir: str | os.PathLike, *, phase: str | None = None) -> Iterator[LoggedRollout]:
    """Every indexed rollout of a run directory, by phase, then step, then file order."""
    root = os.path.join(os.fspath(workdir), EVENTS_DIR)
    if not os.path.isdir(root):
        return
    phases = [phase] if phase is not None else sorted(os.listdir(root))
    for ph in phases:
        base = os.path.join(root, ph)
        if not os.path.isdir(base):
            continue
        steps = [d for d in os.listdir(base) if d.startswith("step") and d[4:].isdigit()]
        for d in sorted(steps, key=lambda d: int(d[4:])):
            log_dir = os.path.join(base, d)
            for e in read_index(log_dir):
                path = os.path.join(log_dir, e.file)
                events = read_jsonl(path)
                _check_log(path, events)
                yield LoggedRollout(path=path, events=events, phase=e.phase, step=e.step,
                                    rl_step=e.rl_step, env=e.env, arm=e.arm, extra=e.extra)
