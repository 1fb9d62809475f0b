"""Difficulty tiers: easier task distributions below an environment's own, for a model too small
to score on today's tasks (a group that never scores carries no gradient).

An environment takes its config, the top tier (today's task distribution), and `tiers`: the
easier tiers below it, easiest first, each a mapping of the config fields a tier may change
(each environment names them, `TIER_FIELDS`: fewer subtasks or items, no dependencies, fewer
options or holders, ... and its own `n_train` / `n_heldout`, since an easy tier's task space
can be too small for 512 + 64 distinct tasks), applied over the top config. With n easier
tiers the environment has n + 1, numbered 0 (easiest) to n (the top):

- ids: the top tier keeps `<name>-<split>-<i>`, so today's tasks stay what they are (ids,
  content, rewards); tier t < n has `<name>-t<t>-<split>-<i>`, which `split_of` reads alike;
- content: each tier has its own `TaskTable`; a lower tier draws from its own random stream
  (`stream=(t + 1,)`) and keeps its held-out content apart from its own training tasks;
- `task_ids(split)` lists every tier's tasks, the top tier's first (so the first N held-out
  tasks are today's), then t0, t1, ...; `tier_task_ids(split, t)` one tier's;
  `tier_of(task_id)` a task's tier;
- a tier's sessions run under that tier's config (its default clock and rules); the teacher,
  tools and timing units are the environment's, shared by every tier.
An environment built without easier tiers (the default) is exactly today's.

Which tiers are easier is measured, not assumed: `python -m avalon.tools.env_baselines
--by_tier` prints each tier's scripted baselines (chance, single agent, organisations).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from avalon.envs.base import Split, TaskTable

C = TypeVar("C")  # an environment's config dataclass
T = TypeVar("T")  # a task spec


def tier_name(tier: int) -> str:
    """The name a tier is logged under: t0 (easiest), t1, ..."""
    return f"t{tier}"


def tier_configs(top: C, easier: Sequence[Mapping[str, Any]], fields: frozenset[str]
                 ) -> tuple[C, ...]:
    """Every tier's config, easiest first, the top last: each of `easier` (field -> value,
    only `fields`) over `top`. Lists become tuples (a command line or JSON gives lists). A bad
    tier is one line naming it and its field."""
    owner = type(top).__name__
    if isinstance(easier, (str, Mapping)) or not isinstance(easier, Sequence):
        raise ValueError(f"{owner} tiers: must be a sequence of mappings (one per easier tier, "
                         f"easiest first), got {easier!r:.120}")
    out = []
    for t, overrides in enumerate(easier):
        where = f"{owner} tier {tier_name(t)}"
        if not isinstance(overrides, Mapping):
            raise ValueError(f"{where}: must be a mapping of fields, got {overrides!r:.120}")
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"{where}: {unknown} cannot vary by tier; a tier sets "
                             f"{sorted(fields)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
        try:
            out.append(dataclasses.replace(top, **values))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return (*out, top)


class TieredTasks(Generic[C, T]):
    """The task tables of every tier of one environment (see the module docstring).

    `make(rng, config)` draws one spec under a tier's config (`make_heldout`, where given,
    draws the held-out ones: `TaskTable`); every config has `n_train`, `n_heldout` and `seed`.
    With one config it is a single `TaskTable` under the name, as an untiered environment
    has."""

    def __init__(self, name: str, configs: Sequence[C],
                 make: Callable[[np.random.Generator, C], T],
                 signature: Callable[[T], Hashable],
                 make_heldout: Callable[[np.random.Generator, C], T] | None = None):
        if not configs:
            raise ValueError(f"{name}: needs at least one tier (the top)")
        self.name, self.configs = name, tuple(configs)
        self.top = len(self.configs) - 1
        self.tables = tuple(
            TaskTable(self.prefix(t), functools.partial(_draw, make, c), signature, c.n_train,
                      c.n_heldout, c.seed, stream=() if t == self.top else (t + 1,),
                      make_heldout=None if make_heldout is None else
                      functools.partial(_draw, make_heldout, c))
            for t, c in enumerate(self.configs))
        self._tier_by_prefix = {table.prefix: t for t, table in enumerate(self.tables)}

    def prefix(self, tier: int) -> str:
        return self.name if tier == self.top else f"{self.name}-{tier_name(tier)}"

    def _check_tier(self, tier: int) -> int:
        if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier <= self.top:
            raise ValueError(f"{self.name}: tier must be an int in 0..{self.top}, got {tier!r}")
        return tier

    def config(self, tier: int) -> C:
        return self.configs[self._check_tier(tier)]

    def ids(self, split: Split) -> tuple[str, ...]:
        """Every tier's ids: the top tier's first, then t0, t1, ..."""
        order = [self.top, *range(self.top)]
        return tuple(i for t in order for i in self.tables[t].ids(split))

    def tier_ids(self, split: Split, tier: int) -> tuple[str, ...]:
        return self.tables[self._check_tier(tier)].ids(split)

    def _guess_tier(self, task_id: str) -> int:
        """The tier whose prefix the id has (the top when none: its table's lookup then
        raises today's error for an unknown id)."""
        if not isinstance(task_id, str):
            return self.top
        return self._tier_by_prefix.get(task_id.rsplit("-", 2)[0], self.top)

    def get(self, task_id: str) -> tuple[C, T]:
        """(the tier's config, the spec) of a task id, or UnknownTaskError."""
        t = self._guess_tier(task_id)
        return self.configs[t], self.tables[t].get(task_id)

    def tier_of(self, task_id: str) -> int:
        t = self._guess_tier(task_id)
        self.tables[t].get(task_id)  # UnknownTaskError for an id no tier has
        return t


def _draw(make: Callable[[np.random.Generator, C], T], config: C,
          rng: np.random.Generator) -> T:
    """One spec drawn under one tier's config (what a tier's `TaskTable` calls)."""
    return make(rng, config)


@runtime_checkable
class Tiered(Protocol):
    """An environment with difficulty tiers (numbered 0, easiest, to n_tiers - 1, the top)."""

    @property
    def n_tiers(self) -> int: ...

    def tier_of(self, task_id: str) -> int: ...

    def tier_task_ids(self, split: Split, tier: int) -> tuple[str, ...]: ...


def tier_task_ids(env, split: Split) -> list[tuple[str, ...]]:
    """Every tier's task ids of `split`, easiest first; an environment without tiers (a remote
    one, or one that has none) is a single tier of all its tasks."""
    if isinstance(env, Tiered):
        return [env.tier_task_ids(split, t) for t in range(env.n_tiers)]
    return [tuple(env.task_ids(split))]

