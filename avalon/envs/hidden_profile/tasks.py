"""Hidden-profile tasks: options, facts, the construction that hides the answer, the prompt.

See `env.py` for the rules. `make_task` checks the invariant on every task it draws.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Sequence

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
    decoy: str  # the top option on the shared facts alone (the answer in a third of tasks)
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


def _identifying(shared: Sequence[int], deltas: Sequence[Sequence[int]], subset) -> bool:
    """Whether option 0 (the answer) strictly tops shared + the holders in `subset`."""
    total = [shared[o] + sum(deltas[h][o] for h in subset) for o in range(len(shared))]
    return total[0] > max(total[1:])


@functools.cache
def _deals(shared: tuple[int, ...], m: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every deal of held polarities (per holder, +1 / -1 for each option, the answer first)
    under which pooling all m holders identifies the answer, keeping those in which the
    fewest proper subsets of holders already do."""
    k = len(shared)
    best: list = []
    fewest = None
    for bits in itertools.product((1, -1), repeat=k * m):
        deltas = tuple(bits[k * h:k * h + k] for h in range(m))
        if not _identifying(shared, deltas, range(m)):
            continue
        early = sum(_identifying(shared, deltas, sub) for k in range(1, m)
                    for sub in itertools.combinations(range(m), k))
        if fewest is None or early < fewest:
            best, fewest = [], early
        if early == fewest:
            best.append(deltas)
    return tuple(best)


def _shared_scores(rng: np.random.Generator, k: int, m: int) -> list[int]:
    """The shared score of each option, the answer first. Today's tasks (three options, two
    or more holders): a random permutation of (+1, 0, -1), so the answer's rank is uniform.
    Easier tiers: with no holder the answer tops the shared facts (the task is the tally);
    with one holder, whose one fact per option moves a score by 1, the scores are a
    permutation of (+1, 0, 0)[:k] (a gap of 2 could not be closed); with two options and two
    or more holders, of (+1, 0)."""
    if m == 0:
        rest = (0, -1)[:k - 1]
        return [1] + [rest[i] for i in rng.permutation(k - 1)]
    pattern = ((1, 0, -1) if m >= 2 else (1, 0, 0))[:k]
    return [pattern[i] for i in rng.permutation(k)]


def make_task(rng: np.random.Generator, n_holders: tuple[int, int],
              n_options: int = 3) -> ProfileTask:
    """The construction (see `env.py`): shared scores from `_shared_scores`; holders one fact
    per option each, drawn uniformly among the deals that identify the answer only once
    pooled (`_deals`)."""
    m = int(rng.integers(n_holders[0], n_holders[1] + 1))
    opts = [OPTIONS[i] for i in rng.choice(len(OPTIONS), size=n_options, replace=False)]
    answer = opts[0]  # roles before shuffling the prompt order: answer, then the others
    attrs = iter(ATTRIBUTES[i] for i in rng.permutation(len(ATTRIBUTES)))
    values = _shared_scores(rng, n_options, m)  # shared score of opts[0], [1], ...
    shared: list[Fact] = []
    for option, v in zip(opts, values):
        if v == 0:  # a balanced pair
            shared += [Fact(option, True, next(attrs)), Fact(option, False, next(attrs))]
        else:
            shared.append(Fact(option, v > 0, next(attrs)))
    deals = _deals(tuple(values), m)
    deltas = deals[int(rng.integers(len(deals)))]
    held = []
    for h in range(m):
        facts = [Fact(o, d > 0, next(attrs)) for o, d in zip(opts, deltas[h])]
        held.append(tuple(facts[i] for i in rng.permutation(len(facts))))
    shared = [shared[i] for i in rng.permutation(len(shared))]
    order = tuple(opts[i] for i in rng.permutation(n_options))
    decoy = best_option(order, shared)
    task = ProfileTask(order, answer, decoy, tuple(shared), tuple(held))
    _check(task)
    return task


def _check(task: ProfileTask) -> None:
    """The hidden-profile invariant: pooling every holder identifies the answer."""
    everything = list(task.shared) + [f for h in task.held for f in h]
    s = scores(task.options, everything)
    if sorted(s.values())[-1] == sorted(s.values())[-2] or \
            best_option(task.options, everything) != task.answer:
        raise RuntimeError(f"hidden_profile: pooled facts do not give the answer: {task}")


def signature(task: ProfileTask) -> tuple:
    return task.options, task.shared, task.held


def prompt(task: ProfileTask) -> str:
    opts = ", ".join(task.options)
    known = "; ".join(f.text for f in task.shared)
    m = len(task.held)
    holders = f" {m} analysts each hold more facts." if m >= 2 else \
        " 1 analyst holds more facts." if m == 1 else ""
    return (f"Choose the best of {opts}: the one with the most good minus bad facts. Known: "
            f"{known}.{holders} Answer with choose.")


def brief_text(facts) -> str:
    return "Your facts: " + "; ".join(f.text for f in facts) + "."
