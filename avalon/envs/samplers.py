"""Samplers: which tasks to roll out (learning progress) and with what hire budget.

`LearningProgressSampler` (SPEC §4, "learning-progress samplers over environments and tasks").
Two levels: first an environment, then a task of it. At each level every key k (an environment,
or an (environment, task) pair) keeps two exponential moving averages of its success s in [0, 1]
(e.g. a group's mean reward over the task's maximum):

    first result:  fast_k = slow_k = s              (no change seen yet)
    later results: fast_k += fast_rate * (s - fast_k);  slow_k += slow_rate * (s - slow_k)
    weight_k = max(|fast_k - slow_k|, floor)        (never visited: unvisited_weight)
    P(env e) = w_e / sum_e' w_e';   P(task t | e) = w_(e,t) / sum_t' w_(e,t')

so a key is drawn more the faster its success is changing (up or down), and never less than
the exploration floor allows. `update` takes every result of one training step and makes one
update per key: a task's s is its group's mean success that step (the mean over all its results
in the call), an environment's the mean of its tasks' means. Change is thus measured *between*
RL steps: K rollouts of one group are samples of one success rate, and feeding them one by one
would move the fast average by their within-group noise, which is not learning progress.
`sample(n)` draws n environments with replacement, then for each environment as many distinct
tasks as it was drawn (with replacement only if it has fewer).

`BudgetSampler` (SPEC §4 "20% of rollouts single-agent, 80% multi-agent", training "up to
b = 8"): b = 0 with probability p_single, else uniform in 1..max_budget. `BudgetConfig.scope`:
one b per rollout (the report's "b sampled per rollout", the default), or one per group, so
that the K rollouts an advantage compares share their budget and differ only in what the
organisation did with it (a group's reward spread then carries no budget luck).

Both are deterministic given their seed and state: a numpy Generator (PCG64) whose bit-generator
state is part of `state()`, a JSON-ready dict the training checkpoint saves; `load_state`
restores it (the same draws follow).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from avalon.validation import FieldChecks

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ProgressConfig:
    fast_rate: float = 0.3
    slow_rate: float = 0.05
    floor: float = 0.02
    unvisited_weight: float = 0.02  # weight of a key with no result yet

    def __post_init__(self):
        check = FieldChecks("ProgressConfig")
        if not 0 < self.slow_rate < self.fast_rate <= 1:
            check.fail_together({"slow_rate": self.slow_rate, "fast_rate": self.fast_rate},
                                "need 0 < slow_rate < fast_rate <= 1")
        if not self.floor > 0 or not self.unvisited_weight > 0:
            check.fail_together({"floor": self.floor, "unvisited_weight": self.unvisited_weight},
                                "must both be > 0")


class _Ema:
    """fast/slow EMAs of success per key (one level of the sampler)."""

    def __init__(self, keys: Sequence[str], config: ProgressConfig):
        self.keys = list(keys)
        self.known = frozenset(self.keys)
        self.config = config
        self.stats: dict[str, list[float]] = {}  # key -> [fast, slow, count]

    def update(self, key: str, s: float) -> None:
        c = self.config
        st = self.stats.get(key)
        if st is None:
            self.stats[key] = [s, s, 1]
            return
        st[0] += c.fast_rate * (s - st[0])
        st[1] += c.slow_rate * (s - st[1])
        st[2] += 1

    def weights(self) -> np.ndarray:
        c = self.config
        w = np.full(len(self.keys), c.unvisited_weight)
        for i, k in enumerate(self.keys):
            st = self.stats.get(k)
            if st is not None:
                w[i] = max(abs(st[0] - st[1]), c.floor)
        return w

    def state(self) -> dict:
        return {k: list(v) for k, v in self.stats.items()}

    def load(self, stats: Mapping, where: str) -> None:
        out = {}
        for k, v in stats.items():
            if k not in self.known:
                raise ValueError(f"{where}: state has key {k!r}, which is not in the sampler")
            if not (isinstance(v, list) and len(v) == 3 and all(
                    isinstance(x, (int, float)) and math.isfinite(x) for x in v)):
                raise ValueError(f"{where}: state of {k!r} must be [fast, slow, count], got {v!r}")
            out[k] = [float(v[0]), float(v[1]), int(v[2])]
        self.stats = out


def _rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def _load_rng(rng: np.random.Generator, state) -> None:
    if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
        raise ValueError(f"sampler state: rng must be a PCG64 state dict, got {state!r}")
    rng.bit_generator.state = state


def _check_version(state, where: str) -> None:
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"{where}: expected a state dict of version {STATE_VERSION}, got "
                         f"{state!r:.120}")


class LearningProgressSampler:
    """Learning-progress sampling over environments, then tasks (see the module docstring)."""

    def __init__(self, tasks: Mapping[str, Sequence[str]],
                 config: ProgressConfig = ProgressConfig(), seed: int = 0):
        if not tasks:
            raise ValueError("LearningProgressSampler needs at least one environment")
        for env, ids in tasks.items():
            if not ids:
                raise ValueError(f"LearningProgressSampler: environment {env!r} has no tasks")
            if len(set(ids)) != len(ids):
                raise ValueError(f"LearningProgressSampler: environment {env!r} repeats a task")
        self.config = config
        self.envs = _Ema(list(tasks), config)
        self.tasks = {env: _Ema(list(ids), config) for env, ids in tasks.items()}
        self.rng = np.random.default_rng(seed)

    def env_probabilities(self) -> dict[str, float]:
        w = self.envs.weights()
        return dict(zip(self.envs.keys, (w / w.sum()).tolist()))

    def task_probabilities(self, env: str) -> dict[str, float]:
        table = self._table(env)
        w = table.weights()
        return dict(zip(table.keys, (w / w.sum()).tolist()))

    def _table(self, env: str) -> _Ema:
        if env not in self.tasks:
            raise KeyError(f"LearningProgressSampler has no environment {env!r}")
        return self.tasks[env]

    def sample(self, n: int) -> list[tuple[str, str]]:
        """n (environment, task) pairs (see the module docstring for how)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"LearningProgressSampler.sample: n must be an int >= 0, got {n!r}")
        w = self.envs.weights()
        envs = [self.envs.keys[i] for i in self.rng.choice(len(w), size=n, p=w / w.sum())]
        counts: dict[str, int] = {}
        for env in envs:
            counts[env] = counts.get(env, 0) + 1
        picked: dict[str, Iterator[str]] = {}
        for env, count in counts.items():
            table = self.tasks[env]
            tw = table.weights()
            idx = self.rng.choice(len(tw), size=count, replace=count > len(tw), p=tw / tw.sum())
            picked[env] = iter([table.keys[i] for i in idx])
        return [(env, next(picked[env])) for env in envs]

    def update(self, results: Iterable[tuple[str, str, float]]) -> None:
        """Records every (environment, task, success in [0, 1]) result of ONE training step
        (all rollouts of all groups): one update per task, from its mean success."""
        per_task: dict[tuple[str, str], list[float]] = {}
        for env, task, s in results:
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1:
                raise ValueError(f"LearningProgressSampler.update: success of ({env!r}, "
                                 f"{task!r}) must be a number in [0, 1], got {s!r}")
            if task not in self._table(env).known:
                raise KeyError(f"LearningProgressSampler: environment {env!r} has no task "
                               f"{task!r}")
            per_task.setdefault((env, task), []).append(float(s))
        per_env: dict[str, list[float]] = {}
        for (env, task), values in per_task.items():  # one update per task per step
            mean = sum(values) / len(values)
            self.tasks[env].update(task, mean)
            per_env.setdefault(env, []).append(mean)
        for env, means in per_env.items():
            self.envs.update(env, sum(means) / len(means))

    def state(self) -> dict:
        return {"version": STATE_VERSION, "rng": _rng_state(self.rng),
                "envs": self.envs.state(),
                "tasks": {env: t.state() for env, t in self.tasks.items()}}

    def load_state(self, state: Mapping) -> None:
        where = "LearningProgressSampler.load_state"
        _check_version(state, where)
        tasks = state.get("tasks")
        if not isinstance(tasks, dict):
            raise ValueError(f"{where}: 'tasks' must be a dict, got {tasks!r:.80}")
        for env in tasks:
            self._table(env)
        self.envs.load(state.get("envs", {}), where)
        for env, stats in tasks.items():
            self.tasks[env].load(stats, f"{where} (environment {env!r})")
        _load_rng(self.rng, state.get("rng"))


class BudgetScope(enum.Enum):
    ROLLOUT = "rollout"  # a budget per rollout (the report)
    GROUP = "group"  # one budget for all K rollouts of a group


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    p_single: float = 0.2
    max_budget: int = 8
    scope: BudgetScope = BudgetScope.ROLLOUT

    def __post_init__(self):
        check = FieldChecks("BudgetConfig")
        if not 0 <= self.p_single <= 1:
            check.fail("p_single", self.p_single, "must be in [0, 1]")
        if isinstance(self.max_budget, bool) or not isinstance(self.max_budget, int) or \
                self.max_budget < 1:
            check.fail("max_budget", self.max_budget, "must be an int >= 1")

    def probabilities(self) -> np.ndarray:
        """P(b) for b = 0..max_budget."""
        p = np.full(self.max_budget + 1, (1 - self.p_single) / self.max_budget)
        p[0] = self.p_single
        return p


class BudgetSampler:
    """The organisation budget b per rollout (see the module docstring)."""

    def __init__(self, config: BudgetConfig = BudgetConfig(), seed: int = 0):
        self.config = config
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"BudgetSampler.sample: n must be an int >= 0, got {n!r}")
        single = self.rng.random(n) < self.config.p_single
        multi = self.rng.integers(1, self.config.max_budget + 1, size=n)
        return [0 if s else int(b) for s, b in zip(single, multi)]

    def sample_groups(self, n_groups: int, k: int) -> list[int]:
        """Budgets of n_groups groups of k rollouts, group by group (`BudgetConfig.scope`)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"BudgetSampler.sample_groups: k must be an int >= 1, got {k!r}")
        if self.config.scope is BudgetScope.ROLLOUT:
            return self.sample(n_groups * k)
        return [b for b in self.sample(n_groups) for _ in range(k)]

    def state(self) -> dict:
        return {"version": STATE_VERSION, "rng": _rng_state(self.rng)}

    def load_state(self, state: Mapping) -> None:
        _check_version(state, "BudgetSampler.load_state")
        _load_rng(self.rng, state.get("rng"))
