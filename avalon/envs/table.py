"""What every table-driven environment does alike: ids, specs, tasks and sessions over seeded
task tables.

Such an environment draws its tasks from one `TaskTable` per difficulty tier (`TieredTasks`,
`tiers.py`: a single table under the environment's prefix when it takes no tiers), reads a
task id as (its tier's config, its spec), checks the clock against that config's default and
opens a session. `TableEnv` does this once; a subclass names itself, hands its config and its
draw `make(rng, config) -> spec` to `TableEnv.__init__`, and says in `_open` how a session of
one looked-up task starts. `TieredEnv` adds the `Tiered` protocol for the environments that
take easier tiers; the others stay outside it, a single tier to the curriculum and evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from avalon.envs.base import Split, check_clock
from avalon.envs.tiers import TieredTasks, tier_configs
from avalon.org.env import Task


class TableConfig(Protocol):
    """What a table-driven environment's config (a frozen dataclass) has."""

    @property
    def clock_s(self) -> float: ...  # the default wall clock of a session

    @property
    def n_train(self) -> int: ...

    @property
    def n_heldout(self) -> int: ...

    @property
    def seed(self) -> int: ...


C = TypeVar("C", bound=TableConfig)  # an environment's config
T = TypeVar("T")  # a task spec
S = TypeVar("S")  # a session (an `EnvSession`)


class TableEnv(Generic[C, T, S]):
    """An environment over seeded task tables (see the module docstring). `prefix` (default
    `name`) begins the task ids and the messages about them; `make_heldout` draws held-out
    specs from their own space (`TaskTable`); `tiers` are easier tiers below `config`, each
    setting only `tier_fields` (`tiers.py`; a `TieredEnv` passes them)."""

    name: str
    uses_workspace = False  # True where sessions read the rollout's workspace

    def __init__(self, config: C, make: Callable[[np.random.Generator, C], T],
                 signature: Callable[[T], Hashable], *, prefix: str | None = None,
                 make_heldout: Callable[[np.random.Generator, C], T] | None = None,
                 tiers: Sequence[Mapping[str, Any]] = (),
                 tier_fields: frozenset[str] = frozenset()):
        self.config = config
        self.tasks: TieredTasks[C, T] = TieredTasks(
            self.name if prefix is None else prefix, tier_configs(config, tiers, tier_fields),
            make, signature, make_heldout)

    def task_ids(self, split: Split) -> tuple[str, ...]:
        return self.tasks.ids(split)

    def spec(self, task_id: str) -> T:
        return self.tasks.get(task_id)[1]

    def task(self, task_id: str, clock_s: float | None = None) -> Task:
        return self.session(task_id, 0, clock_s).task

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> S:
        config, spec, clock = self._lookup(task_id, clock_s)
        return self._open(task_id, spec, seed, clock, config)

    def _lookup(self, task_id: str, clock_s: float | None) -> tuple[C, T, float]:
        """The task's tier config, its spec, and the clock (its tier's default if None)."""
        config, spec = self.tasks.get(task_id)
        clock = check_clock(clock_s, config.clock_s, f"{self.tasks.name} task {task_id!r}")
        return config, spec, clock

    def _open(self, task_id: str, spec: T, seed: int, clock_s: float, config: C) -> S:
        """A fresh session of one task under its tier's config and a checked clock."""
        raise NotImplementedError


class TieredEnv(TableEnv[C, T, S]):
    """A `TableEnv` with difficulty tiers, numbered 0 (easiest) to `n_tiers - 1` (the top,
    `config`): the `Tiered` protocol of `tiers.py`."""

    @property
    def n_tiers(self) -> int:
        return len(self.tasks.configs)

    def tier_of(self, task_id: str) -> int:
        return self.tasks.tier_of(task_id)

    def tier_config(self, tier: int) -> C:
        return self.tasks.config(tier)

    def tier_task_ids(self, split: Split, tier: int) -> tuple[str, ...]:
        return self.tasks.tier_ids(split, tier)
