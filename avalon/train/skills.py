"""Skill rows: the toy's stand-in for pretraining, mixed into SFT.

A real RLCR run starts from a pretrained model that can already copy a value it has read and
do small arithmetic. A toy model trained from scratch on teacher traces learns the traces' form
(plans, hires, tool calls) long before their content: every value it must copy (a build's code,
a subtask's result) or compute (`add 3 8`) stays at chance (experiments/bench/RESULTS.md, "Why
the toy does not check answers"), because the traces hold a few such tokens per thousand.
Skill rows hold little else: generated text in the tokenizer's own words, no environment task,
with the loss on the answers only.

- `Skill.RECALL`: a list of key-value pairs, then keys asked back in random order (`p3 47 , s1
  8 , ... ; p3 47 s1 8`): the answer is the value that followed the key (an induction copy, what
  passing on a result or a code needs).
- `Skill.ADD` / `MAX` / `MIN` / `SUB` / `MUL`: `add 3 8 11` over digit operands, the
  parallel-subtasks environment's ops.
Rows are drawn from `default_rng([seed, 3, i])`, so they are the same on resume.
"""

from __future__ import annotations

import enum
import re

import numpy as np

from avalon.envs.parallel.tasks import Op
from avalon.rl.types import TokenFlag, TrajectoryRow

_KEY = re.compile(r"^[a-z]+\d$")  # ids such as p3, s1, r2, a4


class Skill(enum.Enum):
    RECALL = "recall"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    MAX = "max"
    MIN = "min"

    def apply(self, a: int, b: int) -> int:
        """An arithmetic skill is environment 1's op of the same name."""
        if self is Skill.RECALL:
            raise ValueError("Skill recall is not an arithmetic op")
        return Op(self.value).apply(a, b)


def recall_keys(words) -> tuple[str, ...]:
    """The id-like words of a vocabulary (`p3`, `s1`, ...): the keys of recall rows."""
    keys = tuple(dict.fromkeys(w for w in words if _KEY.match(w)))
    if len(keys) < 2:
        raise ValueError(f"skill rows: the vocabulary has {len(keys)} id-like words (p1, s2, "
                         "...); recall needs at least 2")
    return keys


class SkillRows:
    """Generates skill rows with `tokenizer`; a row's length is drawn from `row_tokens` (lo, hi).

    Short rows matter: the toy's attention has no positional encoding, so at initialisation it
    spreads over the whole row, and the gradient toward the one token to copy shrinks with the
    row's length. Rows from 48 tokens up let the copy be learnt on short ones first.
    """

    def __init__(self, tokenizer, skills: tuple[Skill, ...], keys: tuple[str, ...], *,
                 row_tokens: tuple[int, int], seed: int):
        if not skills:
            raise ValueError("skill rows: no skills given")
        lo, hi = row_tokens
        if not 32 <= lo <= hi:
            raise ValueError(f"skill rows: row_tokens={row_tokens} must be (lo, hi), "
                             "32 <= lo <= hi")
        self.tokenizer = tokenizer
        self.skills = skills
        self.keys = keys
        self.row_tokens = (lo, hi)
        self.seed = seed
        self._ids: dict[str, list[int]] = {}

    def _encode(self, piece: str) -> list[int]:
        if piece not in self._ids:
            self._ids[piece] = list(self.tokenizer.encode(piece))
        return self._ids[piece]

    def _recall(self, rng) -> list[tuple[str, bool]]:
        n = int(rng.integers(2, min(8, len(self.keys)) + 1))
        keys = [self.keys[int(i)] for i in rng.choice(len(self.keys), n, replace=False)]
        values = [str(int(v)) for v in rng.integers(0, 100, n)]
        out: list[tuple[str, bool]] = []
        for k, v in zip(keys, values):  # the facts carry no loss: they are random
            out += [(k, False), (" ", False), (v, False), (" , ", False)]
        out[-1] = (" ; ", False)
        for j in rng.permutation(n):
            out += [(keys[j], False), (" ", False), (values[j], True), (" ", False)]
        out.append(("\n", False))
        return out

    def _arith(self, skill: Skill, rng) -> list[tuple[str, bool]]:
        a, b = (int(x) for x in rng.integers(0, 10, 2))
        if skill is Skill.SUB and a < b:
            a, b = b, a
        return [(f"{skill.value} {a} {b} ", False), (str(skill.apply(a, b)), True), ("\n", False)]

    def row(self, index: tuple[int, ...], max_tokens: int | None = None) -> TrajectoryRow:
        """Row `index` (any tuple of ints: the row is a function of it and the seed), at most
        `max_tokens` long."""
        rng = np.random.default_rng([self.seed, 3, *index])
        lo, hi = self.row_tokens
        length = int(rng.integers(lo, hi + 1))
        if max_tokens is not None:
            length = min(length, max_tokens)
        tokens: list[int] = []
        mask: list[bool] = []
        misses = 0
        while misses < 64:  # an example too long for an empty row is drawn again
            skill = self.skills[int(rng.integers(len(self.skills)))]
            pieces = self._recall(rng) if skill is Skill.RECALL else self._arith(skill, rng)
            ids = [(t, m) for p, m in pieces for t in self._encode(p)]
            if len(tokens) + len(ids) > length:
                if tokens:
                    break
                misses += 1
                continue
            tokens += [t for t, _ in ids]
            mask += [m for _, m in ids]
        if not any(mask):
            raise ValueError(f"skill rows: {length} tokens hold no whole example")
        t = len(tokens)
        return TrajectoryRow(tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(mask),
                             sampler_logp=np.zeros(t, np.float32), routing=None,
                             flags=np.full(t, TokenFlag.NORMAL, np.int8), agent="skills",
                             role="skills")

    def fill(self, index: tuple[int, ...], capacity: int) -> list[TrajectoryRow]:
        """Rows that together fill one packed sequence of `capacity` tokens."""
        rows, left = [], capacity
        while left >= self.row_tokens[0]:
            rows.append(self.row((*index, len(rows)), max_tokens=left))
            left -= len(rows[-1].tokens)
        return rows
