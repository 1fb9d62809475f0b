"""A curriculum that follows the model: online difficulty filtering within a tier, and
promotion through an environment's difficulty tiers (`tiers.py`) as the model learns.

A group whose K rollouts all scored the same carries no gradient (its advantages are all 0 and
the group is dropped), and a small model meets mostly such groups on tasks beyond it. So
`DifficultySampler` draws each step's tasks from the tier the model is at, leaves out for a
while the tasks it last measured at a group pass rate of 0 or 1, and moves an environment up a
tier once the model passes most of that tier.

State per environment e: its current tier `level(e)` (from `start_tier`, at most its top);
per task: its last group pass rate, the step it was measured at and the step it rests until.

`sample(n)`: n draws; each picks an environment uniformly (with replacement), then a tier:
with probability `p_lower` a tier below the current one (uniform among them; a look back, so
what was learnt is kept), with `p_higher` the tier above (a look ahead), else the current one
(where the drawn direction has no tier, the current one), then a task of that tier uniformly
among those not resting and not drawn yet this step; when every task of the tier rests or
was drawn, among those not drawn yet, then among all. Several calls before one `update`
(refills of dropped groups) keep drawing tasks not drawn yet this step.

`update(results)`: once per RLCR step, with every `(environment, task, success)` of the step
(success in [0, 1]: a group's mean reward over the task's maximum, or each rollout's; all of a
task's results in the call are pooled: their mean is its group pass rate). Then:
- a task whose pass rate is 0 or 1 (or, with `skip_uniform`, whose several results were all
  equal: no variance either) rests for the next `skip_steps` steps (online difficulty
  filtering: it is not drawn while others are eligible);
- a tier's pass rate is the mean, over its tasks measured in the last `window` steps, of each
  task's last pass rate: a resting task counts with the rate it rests on, so leaving out the
  tasks the model has mastered does not make its tier look harder than it is;
- promotion: once at least `min_tasks` tasks of an environment's current tier have been
  measured since it entered that tier (within the window), and their pass rate reaches
  `promote_at`, the environment moves up one tier; below `demote_below` (0: never) it moves
  down one. Each move starts the count afresh, so a look ahead made before a promotion does
  not decide the next one.

Deterministic from its seed and state (a numpy PCG64 generator whose state is in `state()`, a
JSON-ready dict the checkpoint saves; `load_state` restores it: the same draws follow). For
logging: `level(e)`, `tier_stats()` (each tier's pass rate, tasks measured, groups, resting
tasks) and `metrics()` (the same as flat `curriculum/...` keys).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from avalon.envs.base import Split
from avalon.envs.samplers import _load_rng, _rng_state
from avalon.envs.tiers import tier_name, tier_task_ids
from avalon.validation import FieldChecks

STATE_VERSION = 1
_EPS = 1e-9  # a pass rate this close to 0 or 1 is 0 or 1 (a mean of float rewards)


@dataclasses.dataclass(frozen=True)
class DifficultyConfig:
    """The curriculum's rules (see the module docstring). `enabled=False` (the default): the
    training loop keeps the learning-progress sampler, the report's."""

    enabled: bool = False
    start_tier: int = 0  # every environment starts here (at most its top tier)
    promote_at: float = 0.6  # a tier's recent pass rate that moves its environment up
    demote_below: float = 0.0  # ... and down (0: never)
    window: int = 8  # steps a task's last pass rate counts toward its tier's
    min_tasks: int = 8  # tasks measured at the current tier before a move
    p_lower: float = 0.1  # chance a draw looks back to a lower tier
    p_higher: float = 0.1  # chance a draw looks ahead to the next tier
    skip_steps: int = 4  # steps a task rests after a group pass rate of 0 or 1
    skip_uniform: bool = True  # rest also when a task's results in a step were all equal

    def __post_init__(self):
        check = FieldChecks("DifficultyConfig")
        check.is_bool(self, "enabled")
        check.is_bool(self, "skip_uniform")
        check.int_at_least(self, "start_tier", 0)
        check.int_at_least(self, "window", 1)
        check.int_at_least(self, "min_tasks", 1)
        check.int_at_least(self, "skip_steps", 0)
        for name in ("promote_at", "demote_below", "p_lower", "p_higher"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                check.fail(name, value, "must be a number")
        if not 0 < self.promote_at <= 1:
            check.fail("promote_at", self.promote_at, "must be in (0, 1]")
        if not 0 <= self.demote_below < self.promote_at:
            check.fail("demote_below", self.demote_below,
                       f"must be in [0, promote_at={self.promote_at})")
        for name in ("p_lower", "p_higher"):
            if not 0 <= getattr(self, name) <= 1:
                check.fail(name, getattr(self, name), "must be in [0, 1]")
        if self.p_lower + self.p_higher > 1:
            check.fail_together({"p_lower": self.p_lower, "p_higher": self.p_higher},
                                "must add up to at most 1")
        if self.skip_steps >= self.window:
            # A resting task must still count toward its tier when it could next be drawn,
            # else the mastered tasks drop out of the tier's pass rate and it reads too low.
            check.fail("skip_steps", self.skip_steps,
                       f"must be below window={self.window}")


def train_tiers(envs) -> dict[str, list[tuple[str, ...]]]:
    """{environment name: every tier's training task ids, easiest first}: the sampler's input
    (an environment without tiers is one tier)."""
    return {env.name: tier_task_ids(env, Split.TRAIN) for env in envs}


class _Task:
    """What the sampler knows of one task."""

    __slots__ = ("rate", "measured", "rest_until", "groups")

    def __init__(self, rate: float, measured: int, rest_until: int, groups: int):
        self.rate, self.measured, self.rest_until, self.groups = rate, measured, rest_until, \
            groups

    def to_json(self) -> list:
        return [self.rate, self.measured, self.rest_until, self.groups]


class DifficultySampler:
    """Online difficulty filtering and tier promotion (see the module docstring)."""

    def __init__(self, tiers: Mapping[str, Sequence[Sequence[str]]],
                 config: DifficultyConfig = DifficultyConfig(), seed: int = 0):
        where = "DifficultySampler"
        if not tiers:
            raise ValueError(f"{where} needs at least one environment")
        self.config = config
        self.tiers: dict[str, list[tuple[str, ...]]] = {}
        self._tier_of: dict[str, dict[str, int]] = {}
        for env, levels in tiers.items():
            if not levels:
                raise ValueError(f"{where}: environment {env!r} has no tiers")
            self.tiers[env] = [tuple(ids) for ids in levels]
            self._tier_of[env] = {}
            for t, ids in enumerate(self.tiers[env]):
                if not ids:
                    raise ValueError(f"{where}: environment {env!r} tier {tier_name(t)} has no "
                                     "tasks")
                for task in ids:
                    if task in self._tier_of[env]:
                        raise ValueError(f"{where}: environment {env!r} repeats task {task!r}")
                    self._tier_of[env][task] = t
        self.envs = list(self.tiers)
        self.rng = np.random.default_rng(seed)
        self.step = 0  # updates so far (RLCR steps measured)
        self.levels = {e: min(config.start_tier, len(self.tiers[e]) - 1) for e in self.envs}
        self.entered = dict.fromkeys(self.envs, 0)  # the step each entered its current tier
        self.moves = dict.fromkeys(self.envs, 0)  # promotions and demotions so far
        self.tasks: dict[str, dict[str, _Task]] = {e: {} for e in self.envs}
        self.drawn: set[tuple[str, str]] = set()  # drawn since the last update

    # ---- reading ---------------------------------------------------------------------------
    def _env(self, env: str) -> str:
        if env not in self.tiers:
            raise KeyError(f"DifficultySampler has no environment {env!r}")
        return env

    def level(self, env: str) -> int:
        """The environment's current tier (0: easiest)."""
        return self.levels[self._env(env)]

    def tier_of(self, env: str, task: str) -> int:
        t = self._tier_of[self._env(env)].get(task)
        if t is None:
            raise KeyError(f"DifficultySampler: environment {env!r} has no task {task!r}")
        return t

    def _recent(self, env: str, tier: int, since: int) -> list[float]:
        """Last pass rates of the tier's tasks measured at step >= since."""
        table = self._tier_of[env]
        return [rec.rate for task, rec in self.tasks[env].items()
                if table[task] == tier and rec.measured >= since]

    def tier_stats(self) -> dict[str, list[dict]]:
        """{environment: per tier, easiest first, {"tier", "pass_rate" (None: nothing measured
        in the window), "tasks" (measured in the window), "groups" (measured ever),
        "resting"}} and which tier is current."""
        out = {}
        since = self.step - self.config.window
        for env in self.envs:
            rows = []
            for t in range(len(self.tiers[env])):
                recent = self._recent(env, t, since)
                recs = [r for task, r in self.tasks[env].items() if self._tier_of[env][task] == t]
                rows.append({"tier": tier_name(t), "current": t == self.levels[env],
                             "pass_rate": float(np.mean(recent)) if recent else None,
                             "tasks": len(recent), "groups": sum(r.groups for r in recs),
                             "resting": sum(r.rest_until > self.step for r in recs)})
            out[env] = rows
        return out

    def metrics(self) -> dict[str, float]:
        """Flat keys for metrics.jsonl: `curriculum/<env>/tier`, `.../moves`, and per tier
        `curriculum/<env>/<tier>/{pass_rate,tasks,resting}` (pass_rate only once measured)."""
        out: dict[str, float] = {}
        for env, rows in self.tier_stats().items():
            out[f"curriculum/{env}/tier"] = float(self.levels[env])
            out[f"curriculum/{env}/moves"] = float(self.moves[env])
            for row in rows:
                key = f"curriculum/{env}/{row['tier']}"
                if row["pass_rate"] is not None:
                    out[f"{key}/pass_rate"] = row["pass_rate"]
                out[f"{key}/tasks"] = float(row["tasks"])
                out[f"{key}/resting"] = float(row["resting"])
        return out

    # ---- drawing ---------------------------------------------------------------------------
    def sample(self, n: int) -> list[tuple[str, str]]:
        """n (environment, task) pairs (see the module docstring for how)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"DifficultySampler.sample: n must be an int >= 0, got {n!r}")
        out = []
        for i in self.rng.integers(len(self.envs), size=n):
            env = self.envs[int(i)]
            task = self._draw_task(env, self._draw_tier(env))
            self.drawn.add((env, task))
            out.append((env, task))
        return out

    def _draw_tier(self, env: str) -> int:
        c, level, top = self.config, self.levels[env], len(self.tiers[env]) - 1
        u = self.rng.random()
        if u < c.p_lower:
            return int(self.rng.integers(level)) if level > 0 else level
        if u < c.p_lower + c.p_higher:
            return min(level + 1, top)
        return level

    def _draw_task(self, env: str, tier: int) -> str:
        ids = self.tiers[env][tier]
        fresh = [t for t in ids if (env, t) not in self.drawn]
        known = self.tasks[env]
        eligible = [t for t in fresh if t not in known or known[t].rest_until <= self.step]
        pool = eligible or fresh or list(ids)
        return pool[int(self.rng.integers(len(pool)))]

    # ---- learning --------------------------------------------------------------------------
    def update(self, results: Iterable[tuple[str, str, float]]) -> None:
        """Records every (environment, task, success in [0, 1]) result of ONE training step,
        then rests, promotes and demotes (see the module docstring)."""
        per_task: dict[tuple[str, str], list[float]] = {}
        for env, task, s in results:
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1:
                raise ValueError(f"DifficultySampler.update: success of ({env!r}, {task!r}) "
                                 f"must be a number in [0, 1], got {s!r}")
            self.tier_of(env, task)
            per_task.setdefault((env, task), []).append(float(s))
        c, step = self.config, self.step
        for (env, task), values in per_task.items():
            rate = sum(values) / len(values)
            settled = not _EPS < rate < 1 - _EPS or (c.skip_uniform and len(values) > 1
                                                     and max(values) == min(values))
            rest_until = step + 1 + c.skip_steps if settled else 0
            old = self.tasks[env].get(task)
            self.tasks[env][task] = _Task(rate, step, rest_until,
                                          (old.groups if old else 0) + 1)
        self.step += 1
        self.drawn.clear()
        for env in self.envs:
            self._move(env)

    def _move(self, env: str) -> None:
        c, level = self.config, self.levels[env]
        recent = self._recent(env, level, max(self.entered[env], self.step - c.window))
        if len(recent) < c.min_tasks:
            return
        rate = sum(recent) / len(recent)
        if rate >= c.promote_at and level < len(self.tiers[env]) - 1:
            self.levels[env] = level + 1
        elif rate < c.demote_below and level > 0:
            self.levels[env] = level - 1
        else:
            return
        self.entered[env] = self.step
        self.moves[env] += 1

    # ---- checkpoint ------------------------------------------------------------------------
    def state(self) -> dict:
        return {"version": STATE_VERSION, "rng": _rng_state(self.rng), "step": self.step,
                "levels": dict(self.levels), "entered": dict(self.entered),
                "moves": dict(self.moves),
                "tasks": {e: {t: r.to_json() for t, r in recs.items()}
                          for e, recs in self.tasks.items()},
                "drawn": sorted([e, t] for e, t in self.drawn)}

    def load_state(self, state: Mapping) -> None:
        where = "DifficultySampler.load_state"
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"{where}: expected a state dict of version {STATE_VERSION}, got "
                             f"{state!r:.120}")
        step = _count(state.get("step"), f"{where}: step")
        per_env = {}
        for key in ("levels", "entered", "moves"):
            value = state.get(key)
            if not isinstance(value, dict) or set(value) != set(self.envs):
                raise ValueError(f"{where}: {key!r} must name every environment "
                                 f"{self.envs}, got {value!r:.120}")
            per_env[key] = {e: _count(v, f"{where}: {key}[{e!r}]") for e, v in value.items()}
        for env, level in per_env["levels"].items():
            if level >= len(self.tiers[env]):
                raise ValueError(f"{where}: environment {env!r} has tiers 0.."
                                 f"{len(self.tiers[env]) - 1}, state says {level}")
        tasks = state.get("tasks")
        if not isinstance(tasks, dict) or not set(tasks) <= set(self.envs):
            raise ValueError(f"{where}: 'tasks' must map environments to tasks, got "
                             f"{tasks!r:.120}")
        records: dict[str, dict[str, _Task]] = {e: {} for e in self.envs}
        for env, recs in tasks.items():
            if not isinstance(recs, dict):
                raise ValueError(f"{where}: tasks of {env!r} must be a dict, got {recs!r:.80}")
            for task, rec in recs.items():
                if task not in self._tier_of[env]:
                    raise ValueError(f"{where}: state has task {task!r} of {env!r}, which is "
                                     "not in the sampler")
                if not (isinstance(rec, list) and len(rec) == 4 and isinstance(
                        rec[0], (int, float)) and 0 <= rec[0] <= 1):
                    raise ValueError(f"{where}: state of {task!r} must be [pass_rate, "
                                     f"measured, rest_until, groups], got {rec!r}")
                records[env][task] = _Task(float(rec[0]), *(
                    _count(x, f"{where}: state of {task!r}") for x in rec[1:]))
        drawn = state.get("drawn", [])
        if not isinstance(drawn, list) or not all(
                isinstance(d, list) and len(d) == 2 and d[0] in self._tier_of
                and d[1] in self._tier_of[d[0]] for d in drawn):
            raise ValueError(f"{where}: 'drawn' must be [environment, task] pairs of the "
                             f"sampler, got {drawn!r:.120}")
        _load_rng(self.rng, state.get("rng"))
        self.step, self.tasks = step, records
        self.levels, self.entered, self.moves = (per_env[k] for k in
                                                 ("levels", "entered", "moves"))
        self.drawn = {(e, t) for e, t in drawn}


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be an int >= 0, got {value!r}")
    return value
