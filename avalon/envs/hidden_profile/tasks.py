"""Hidden-profile tasks: options, facts, the construction that hides the answer, the prompt.

See `env.py` for the rules. `make_task` checks the invariant on every task it draws.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

OPTIONS = ("atlas", "borea", "cirra", "delta", "ember", "fjord", "gale", "helix", "indra",
           "juno", "kepler", "lumen")
ATTRIBUTES = ("price", "speed", "support", "quality", "safety", "design", "range", "comfort",
              "service", "warranty", "size", "weight", "noise", "power", "battery", "screen",
              "sound", "grip", "finish", "fuel", "storage", "security", "access", "training",
              "reviews", "delivery", "stock", "repairs", "software", "hardware", "cooling",
              "lighting")
FACT = re.compile(r"\b([a-z]+) (good|bad) ([a-z]+)\b")


@dataclasses.dataclass(frozen=True)
class Fact:
    option: str
    good: bool
    attribute: str

    @property
    def text(self) -> str:
        return f"{self.option} {'good' if self.good else 'bad'} {self.attribute}"


@dataclasses.dataclass(frozen=True)
class ProfileTask:
    options: tuple[str, ...]  # prompt order
    answer: str
    decoy: str
    shared: tuple[Fact, ...]
    held: tuple[tuple[Fact, ...], ...]  # one tuple per holder


def scores(options, facts) -> dict[str, int]:
    """Good minus bad facts per option (each distinct fact counted once)."""
    out = dict.fromkeys(options, 0)
    for f in set(facts):
        if f.option in out:
            out[f.option] += 1 if f.good else -1
    return out


def best_option(options, facts) -> str:
    """The top-scoring option (ties: the first in prompt order)."""
    s = scores(options, facts)
    return max(options, key=lambda o: (s[o], -options.index(o)))


def make_task(rng: np.random.Generator, n_holders: tuple[int, int]) -> ProfileTask:
    m = int(rng.integers(n_holders[0], n_holders[1] + 1))
    opts = [OPTIONS[i] for i in rng.choice(len(OPTIONS), size=3, replace=False)]
    answer, decoy, other = opts  # roles before shuffling the prompt order
    attrs = iter(ATTRIBUTES[i] for i in rng.permutation(len(ATTRIBUTES)))
    a = int(rng.integers(1, 2 * m - 1))  # 1 .. 2m - 2 shared goods for the decoy
    shared = [Fact(decoy, True, next(attrs)) for _ in range(a)]
    shared += [Fact(answer, False, next(attrs)) for _ in range(2 * m - 1 - a)]
    s_other = a - m - int(rng.integers(0, 2))  # <= the decoy's total
    shared += [Fact(other, s_other > 0, next(attrs)) for _ in range(abs(s_other))]
    noise = opts[int(rng.integers(3))]
    shared += [Fact(noise, True, next(attrs)), Fact(noise, False, next(attrs))]
    held = []
    for _ in range(m):
        facts = [Fact(answer, True, next(attrs)), Fact(decoy, False, next(attrs))]
        noise = opts[int(rng.integers(3))]
        facts += [Fact(noise, True, next(attrs)), Fact(noise, False, next(attrs))]
        held.append(tuple(facts[i] for i in rng.permutation(len(facts))))
    shared = [shared[i] for i in rng.permutation(len(shared))]
    order = tuple(opts[i] for i in rng.permutation(3))
    task = ProfileTask(order, answer, decoy, tuple(shared), tuple(held))
    _check(task)
    return task


def _check(task: ProfileTask) -> None:
    """The hidden-profile invariant: only all holders together give the answer."""
    everything = list(task.shared) + [f for h in task.held for f in h]
    if best_option(task.options, everything) != task.answer:
        raise RuntimeError(f"hidden_profile: pooled facts do not give the answer: {task}")
    for k in range(len(task.held)):
        partial = list(task.shared) + [f for h in task.held[:k] for f in h]
        if best_option(task.options, partial) != task.decoy:
            raise RuntimeError(f"hidden_profile: {k} holders already decide: {task}")


def signature(task: ProfileTask) -> tuple:
    return task.options, task.shared, task.held


def prompt(task: ProfileTask) -> str:
    opts = ", ".join(task.options)
    known = "; ".join(f.text for f in task.shared)
    return (f"Choose the best of {opts}: the one with the most good minus bad facts. Known: "
            f"{known}. {len(task.held)} analysts each hold more facts. Answer with choose.")


def brief_text(facts) -> str:
    return "Your facts: " + "; ".join(f.text for f in facts) + "."
