"""The environment interface: what a training loop needs from an environment, in-process or
over the Open Reward Standard (`avalon/envs/ors_server.py`, `avalon/envs/ors.py`, with the
Avalon extension of docs/ors_extension.md).

An `Environment` lists its tasks per split, describes a task (`Task`: prompt, tools as
`ToolSpec`s with JSON schemas, wall-clock cap, objective) and opens one `EnvSession` per
rollout: the organisation simulator's protocol (`avalon/org/env.py`). Reward events ride on tool
calls (`ToolOutcome.rewards`), terminal events on `ToolOutcome.terminal`, and final rewards and
the wealth ratio on `EnvSession.on_end`.

Splits. Task ids are deterministic from the environment's seed. The held-out split never
overlaps train: not in ids, and not in content (each environment names a content signature;
`TaskTable` rejects a held-out draw whose signature a training task has).

Environments are plain classes, chosen in configs by constructing them. Each in-process
environment also offers a scripted teacher organisation (`teacher(chat, ...) -> Policy`, see
`avalon/envs/teacher.py`); teachers read only tokens, so they can play sessions served over
HTTP too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

import numpy as np

from avalon.org.env import EnvSession, Task

T = TypeVar("T")


class Split(enum.Enum):
    TRAIN = "train"
    HELDOUT = "heldout"


class UnknownTaskError(KeyError):
    """A task id the environment does not have (the message names the id and the env)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class Environment(Protocol):
    """What every environment (in-process or a remote client) offers."""

    @property
    def name(self) -> str: ...

    @property
    def uses_workspace(self) -> bool:
        """Whether sessions read the rollout's workspace (then the ORS extension sends a
        snapshot of it with every call and with the end)."""
        ...

    def task_ids(self, split: Split) -> tuple[str, ...]: ...

    def task(self, task_id: str, clock_s: float | None = None) -> Task:
        """The task as the organisation sees it; `clock_s` overrides the default wall clock."""
        ...

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> EnvSession:
        """A fresh session for one rollout. `seed` drives the session's own randomness
        (environments whose sessions are deterministic ignore it; each says so)."""
        ...

    def vocabulary(self) -> tuple[str, ...]:
        """Words the environment's prompts, tool results and teacher outputs use (runs of
        [A-Za-z0-9_] of length >= 2), for a compact `WordTokenizer`."""
        ...


def check_clock(clock_s: float | None, default: float, where: str) -> float:
    """`clock_s` (or the default) as a positive float, else a ValueError naming `where`."""
    value = default if clock_s is None else clock_s
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: clock_s must be a number > 0, got {clock_s!r}")
    return float(value)


def group_seeds(seed0: int, k: int, common: bool) -> list[int]:
    """Session seeds of the K rollouts of one group: with common random numbers every session
    gets the group's seed `seed0` (environments draw their randomness from the session seed,
    so the group meets the same outcomes and its advantages compare policies, not luck); else
    seed0, seed0 + 1, ... The rollouts' own sampling seeds stay distinct either way."""
    return [seed0] * k if common else [seed0 + i for i in range(k)]


def split_of(task_id: str) -> Split:
    """The split a task id belongs to (ids are `<prefix>-<split>-<index>`)."""
    parts = task_id.rsplit("-", 2)
    if len(parts) != 3:
        raise UnknownTaskError(f"task id {task_id!r} is not <prefix>-<split>-<index>")
    try:
        return Split(parts[1])
    except ValueError:
        raise UnknownTaskError(f"task id {task_id!r}: unknown split {parts[1]!r}") from None


class TaskTable(Generic[T]):
    """Deterministic train and held-out task specs, generated lazily and cached.

    `make(rng) -> spec` draws one spec; `signature(spec)` is its content key. Training task i
    is drawn from `default_rng([seed, 0, i])`; held-out draws come from `default_rng([seed, 1,
    j])` for j = 0, 1, ... and are kept only if their signature is new (not in train, not an
    earlier held-out task), so held-out content never repeats a training task. `make_heldout`
    (default `make`) draws held-out specs from their own space where an environment keeps the
    splits' content apart (software build: held-out functions no training task has). `stream`
    (default none) goes between the seed and the split in every draw's seed list, so tables of
    one seed with different streams (an environment's difficulty tiers, `tiers.py`) draw
    independently.
    """

    def __init__(self, prefix: str, make: Callable[[np.random.Generator], T],
                 signature: Callable[[T], Hashable], n_train: int, n_heldout: int, seed: int,
                 max_draws_per_task: int = 64,
                 make_heldout: Callable[[np.random.Generator], T] | None = None,
                 stream: tuple[int, ...] = ()):
        for name, n in (("n_train", n_train), ("n_heldout", n_heldout)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{prefix}: {name} must be an int >= 1, got {n!r}")
        self.prefix, self.make, self.signature = prefix, make, signature
        self.n = {Split.TRAIN: n_train, Split.HELDOUT: n_heldout}
        self.seed, self.max_draws, self.stream = seed, max_draws_per_task, tuple(stream)
        self.make_heldout = make if make_heldout is None else make_heldout
        self._specs: dict[Split, list[T]] = {}

    def ids(self, split: Split) -> tuple[str, ...]:
        return tuple(f"{self.prefix}-{split.value}-{i}" for i in range(self.n[split]))

    def specs(self, split: Split) -> list[T]:
        if split not in self._specs:
            self._specs[split] = self._build(split)
        return self._specs[split]

    def get(self, task_id: str) -> T:
        """The spec of a task id, or UnknownTaskError."""
        if not isinstance(task_id, str):
            raise UnknownTaskError(f"{self.prefix}: task id must be a string, got {task_id!r}")
        split = split_of(task_id)
        head, _, index = task_id.rpartition("-")
        if head != f"{self.prefix}-{split.value}" or not index.isdigit() or (
                int(index) >= self.n[split]) or index != str(int(index)):
            raise UnknownTaskError(f"environment {self.prefix!r} has no task {task_id!r}")
        return self.specs(split)[int(index)]

    def _build(self, split: Split) -> list[T]:
        if split is Split.TRAIN:
            return [self.make(np.random.default_rng([self.seed, *self.stream, 0, i]))
                    for i in range(self.n[split])]
        seen = {self.signature(s) for s in self.specs(Split.TRAIN)}
        out: list[T] = []
        j = 0
        while len(out) < self.n[split]:
            if j >= self.max_draws * self.n[split]:
                raise ValueError(f"{self.prefix}: found only {len(out)} of {self.n[split]} "
                                 f"held-out tasks unlike the {self.n[Split.TRAIN]} training tasks "
                                 f"in {j} draws; the task space is too small for these sizes")
            spec = self.make_heldout(np.random.default_rng([self.seed, *self.stream, 1, j]))
            j += 1
            sig = self.signature(spec)
            if sig not in seen:
                seen.add(sig)
                out.append(spec)
        return out
