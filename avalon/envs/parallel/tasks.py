"""Tasks of the parallel-subtasks environment: small arithmetic subtasks with work costs and
dependencies, the prompt that states them, and the parser a teacher reads them back with.

A subtask is `s1 max 7 2 work 120`: its answer is max(7, 2) = 7; solving it takes 120 seconds of
work on the derived clock. Solving a subtask correctly also yields its *result*, a digit 0..9
drawn with the task and shown only to the agent whose solve counted (`s1 correct, result 4`).
A dependent subtask takes its parent's result as its first operand: `s3 add r1 5 work 60 after
s1` is r1 + 5, where r1 is s1's result, so whoever solves s3 needs s1's result delivered (a
message, a channel post, a workspace file) unless it solved s1 itself. Work costs are whole
multiples of the environment's unit (`unit_s`), so the best schedule is an integer search
(`schedule.py`). Operands are 0..max_operand; `sub` keeps a >= b, so answers are 0..81.

Hidden operands (`ParallelConfig.inspect`): the prompt lists `s3 work 120 after s1` only, and an
agent calls `look` to see `s3 max 7 2` before it solves (`reveal_text` / `parse_reveal`).
"""

from __future__ import annotations

import dataclasses
import enum
import re

import numpy as np

_ITEM = re.compile(r"\b(s\d+) (add|sub|mul|max|min) (\d+|r\d+) (\d+) work (\d+)"
                   r"((?: after s\d+)*)")
_HIDDEN_ITEM = re.compile(r"\b(s\d+) work (\d+)((?: after s\d+)*)")
_REVEAL = re.compile(r"^(s\d+) (add|sub|mul|max|min) (\d+|r\d+) (\d+)$")
RESULT = re.compile(r"^(s\d+) correct(?: \(waited \d+ for [s\d ]+\))?, result (\d+)")
_CLOCK = re.compile(r"Clock (\d+)")


class Op(enum.Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    MAX = "max"
    MIN = "min"

    def apply(self, a: int, b: int) -> int:
        if self is Op.ADD:
            return a + b
        if self is Op.SUB:
            return a - b
        if self is Op.MUL:
            return a * b
        return max(a, b) if self is Op.MAX else min(a, b)


@dataclasses.dataclass(frozen=True)
class Subtask:
    id: str  # "s1", "s2", ... in prompt order
    op: Op | None  # None: read from a hidden-operand prompt, not looked at yet
    a: int | None  # the first operand; for a dependent subtask its parent's result (hidden)
    b: int | None
    units: int  # work cost in units of the environment's unit_s
    after: tuple[str, ...] = ()  # subtasks that must be solved first
    result: int | None = None  # what a correct solve yields (hidden; None when parsed)

    @property
    def a_from(self) -> str | None:
        """The parent whose result is operand a (`r1` in the prompt), or None."""
        return self.after[0] if self.after else None

    @property
    def answer(self) -> int:
        if self.op is None or self.a is None:
            raise ValueError(f"subtask {self.id}: operands unknown (look at it, or learn its "
                             "parent's result, first)")
        return self.op.apply(self.a, self.b)

    def answer_with(self, parent_result: int | None) -> int:
        """The answer given the parent's result (ignored for a subtask without a parent)."""
        if self.op is None:
            raise ValueError(f"subtask {self.id}: operands unknown (look at it first)")
        a = self.a if self.a_from is None else parent_result
        if a is None:
            raise ValueError(f"subtask {self.id}: needs {self.a_from}'s result")
        return self.op.apply(a, self.b)


def operand_text(s: Subtask) -> str:
    return f"r{s.a_from[1:]}" if s.a_from else str(s.a)


def reveal_text(s: Subtask) -> str:
    """What `look` shows: `s3 max 7 2` (or `s3 add r1 5` for a dependent subtask)."""
    return f"{s.id} {s.op.value} {operand_text(s)} {s.b}"


def _operand(text: str) -> int | None:
    return None if text.startswith("r") else int(text)


def parse_reveal(text: str) -> tuple[str, Op, int | None, int] | None:
    m = _REVEAL.match(text.strip())
    return None if m is None else (m.group(1), Op(m.group(2)), _operand(m.group(3)),
                                   int(m.group(4)))


@dataclasses.dataclass(frozen=True)
class ParallelTask:
    subtasks: tuple[Subtask, ...]

    def index(self) -> dict[str, int]:
        return {s.id: i for i, s in enumerate(self.subtasks)}

    def costs(self) -> list[int]:
        return [s.units for s in self.subtasks]

    def deps(self) -> list[list[int]]:
        """Dependencies as index lists (the schedule's input)."""
        idx = self.index()
        return [[idx[d] for d in s.after] for s in self.subtasks]


def make_task(rng: np.random.Generator, *, n_subtasks: tuple[int, int],
              cost_units: tuple[int, int], dep_prob: float, ops: tuple[Op, ...],
              max_operand: int, max_depth: int = 0) -> ParallelTask:
    """Draws one task: each subtask after the first depends on one random earlier subtask
    with probability `dep_prob` (so the dependencies form a forest of chains and trees), and
    then takes that subtask's result as operand a. Results are uniform digits 0..9. With
    `max_depth` > 0 a parent is drawn only among subtasks less than that deep (1: every tree
    is a star, one subtask whose result many others need)."""
    n = int(rng.integers(n_subtasks[0], n_subtasks[1] + 1))
    out: list[Subtask] = []
    depth: list[int] = []
    for i in range(n):
        op = ops[int(rng.integers(len(ops)))]
        a, b = (int(x) for x in rng.integers(0, max_operand + 1, size=2))
        units = int(rng.integers(cost_units[0], cost_units[1] + 1))
        parents = [j for j in range(i) if not max_depth or depth[j] < max_depth]
        after = (f"s{parents[int(rng.integers(len(parents)))] + 1}",) if parents and \
            rng.random() < dep_prob else ()
        depth.append(depth[int(after[0][1:]) - 1] + 1 if after else 0)
        if after:
            a = out[int(after[0][1:]) - 1].result
            if op is Op.SUB:
                b = int(rng.integers(0, a + 1))  # keeps a >= b
        elif op is Op.SUB and a < b:
            a, b = b, a
        result = int(rng.integers(0, 10))
        out.append(Subtask(f"s{i + 1}", op, a, b, units, after, result))
    return ParallelTask(tuple(out))


def signature(task: ParallelTask) -> tuple:
    return tuple((s.op.value, s.a, s.b, s.units, s.after, s.result) for s in task.subtasks)


def _seconds(x: float) -> str:
    return str(int(round(x)))


def prompt(task: ParallelTask, clock_s: float, unit_s: float, hidden: bool = False) -> str:
    """The task text, e.g. `Subtasks: s1 add 3 4 work 60; s2 mul r1 5 work 120 after s1.
    Clock 300. Call solve with id and answer; each correct subtask before the clock scores 1.`
    With `hidden`, items omit op and operands (`s1 work 60`) and the text says to `look`."""
    items = []
    for s in task.subtasks:
        what = "" if hidden else f" {s.op.value} {operand_text(s)} {s.b}"
        item = f"{s.id}{what} work {_seconds(s.units * unit_s)}"
        items.append(item + "".join(f" after {d}" for d in s.after))
    how = "Call look with id to see a subtask and solve with id and answer" if hidden else \
        "Call solve with id and answer"
    return (f"Subtasks: {'; '.join(items)}. Clock {_seconds(clock_s)}. {how}; each correct "
            "subtask before the clock scores 1 and shows its result to its solver.")


def _units(sid: str, work: int, unit_s: float) -> int:
    units = round(work / unit_s)
    if units < 1 or abs(units * unit_s - work) > 0.5:
        raise ValueError(f"parse_prompt: work {work} of {sid} is not a multiple of unit_s "
                         f"{unit_s}")
    return units


def parse_prompt(text: str, unit_s: float) -> tuple[ParallelTask, float]:
    """The task and clock back from text holding a `prompt` (e.g. a decoded role card)."""
    subtasks = []
    for m in _ITEM.finditer(text):
        units = _units(m.group(1), int(m.group(5)), unit_s)
        after = tuple(re.findall(r"s\d+", m.group(6)))
        subtasks.append(Subtask(m.group(1), Op(m.group(2)), _operand(m.group(3)),
                                int(m.group(4)), units, after))
    if not subtasks:  # a hidden-operand prompt
        for m in _HIDDEN_ITEM.finditer(text):
            units = _units(m.group(1), int(m.group(2)), unit_s)
            after = tuple(re.findall(r"s\d+", m.group(3)))
            subtasks.append(Subtask(m.group(1), None, None, None, units, after))
    clock = _CLOCK.search(text)
    if not subtasks or clock is None:
        raise ValueError("parse_prompt: no subtasks and clock in the text (the teacher reads the "
                         "task from the role card: keep OrgConfig.specialists_see_task on)")
    return ParallelTask(tuple(subtasks)), float(clock.group(1))
