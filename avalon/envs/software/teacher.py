"""The scripted teacher organisation of the software-build environment.

The CEO reads the functions and examples from its role card and hires min(budget, n) engineers
(`Engineer`, tools read_file / write_file / run_code), dealing the functions round-robin (role
`Implement clamp gcd.`). Each engineer writes one module per function, one per turn
(`part_clamp.py`; the teacher knows the reference implementations: it plays a stronger model),
then a check of the task's examples, runs it, and reports to the CEO with its files as evidence.
The CEO then writes `solution.py` importing every part (alone, it writes the parts itself
first), checks the examples with run_code, and submits. One file per turn keeps every turn
within a toy window's output limit.

The silent organisation (`cast(..., silent=True)`, the `org_silent` baseline): engineers are
hired and write their parts but never report, so the CEO writes every part itself, as alone.
"""

from __future__ import annotations

import re

import numpy as np

from avalon.envs.software.functions import BY_NAME
from avalon.envs.teacher import Start, budget, chunks, reports
from avalon.org.policy import AgentView, Step

TEACHER_WORDS = ("Plan", "Engineer", "Implement", "in", "part", "py", "check", "ok", "assert",
                 "from", "import", "print", "solution", "write_file", "run_code", "read_file",
                 "report_to_ceo", "status", "done", "evidence", "file", "submit", "hire",
                 "title", "role", "tools", "wait_for_messages", "path", "text")
_FUNCTION = re.compile(r"^(?:Task: )?([a-z0-9_]+)\([a-z_, ]*\): ", re.MULTILINE)
_EXAMPLE = re.compile(r"^  e\.g\. (([a-z0-9_]+)\(.*)$", re.MULTILINE)
_ROLE = re.compile(r"Implement ([a-z0-9_ ]+)\.")
HIRES_PER_TURN = 3


def _task(context: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Function names and (function, example) pairs from a role card."""
    names = [m.group(1) for m in _FUNCTION.finditer(context) if m.group(1) in BY_NAME]
    examples = [(m.group(2), m.group(1)) for m in _EXAMPLE.finditer(context)]
    if not names:
        raise ValueError("software teacher: no functions in the role card")
    return names, examples


def _check(imports: str, names: list[str], examples: list[tuple[str, str]]) -> str:
    """A script asserting the first example of each of `names`, then printing ok (one per
    function keeps the turn within a turn's output cap)."""
    first = {}
    for fn, ex in examples:
        first.setdefault(fn, ex)
    asserts = "".join(f"assert {ex}\n" for fn, ex in first.items() if fn in names)
    return imports + asserts + "print('ok')\n"


def _write(path: str, text: str) -> tuple[str, dict]:
    return "write_file", {"path": path, "text": text}


def _part(name: str) -> tuple[str, dict]:
    return _write(f"part_{name}.py", BY_NAME[name].source)


def _imports(names: list[str]) -> str:
    return "".join(f"from part_{n} import {n}\n" for n in names)


class CeoActor:
    def __init__(self, start: Start, silent: bool = False):
        self.silent = silent
        self.names, self.examples = _task(start.context)
        self.hires: list | None = None
        self.hired = 0
        self.mine: list[str] = []  # parts the CEO writes itself (when alone)
        self.reported: set[str] = set()
        self.stage = 0  # after the parts: 1 solution.py, 2 check, 3 submit

    def _plan(self, b: int) -> Step:
        h = min(b, len(self.names))
        lists = [self.names[i::h] for i in range(h)]
        self.hired = h
        self.hires = [("hire", {"title": "Engineer", "role": f"Implement {' '.join(fns)}.",
                                "tools": ["read_file", "write_file", "run_code"]})
                      for fns in lists]
        if not h or self.silent:
            self.mine = list(self.names)
            self.hired = 0  # no reports to wait for
        if not h:
            return Step("Plan: write each part, solution.py, check the examples, submit.")
        text = "Plan: " + "; ".join(f"a{i + 1} {' '.join(fns)}"
                                    for i, fns in enumerate(lists)) + "."
        return Step(text, tuple(self._hire()))

    def _hire(self) -> list:
        batch = chunks(self.hires, HIRES_PER_TURN)
        if not batch:
            return []
        self.hires = self.hires[len(batch[0]):]
        return batch[0]

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.hires is None:
            b = budget(view.obs)
            if b is None:
                raise ValueError("software teacher: no budget in the first observation")
            return self._plan(b)
        self.reported |= {sender for sender, _ in reports(view.obs)}
        calls = self._hire()
        if self.hires or len(self.reported) < self.hired:
            return Step("", tuple(calls + [("wait_for_messages", {})]))
        if self.mine:
            name, self.mine = self.mine[0], self.mine[1:]
            return Step("", (_part(name),))
        self.stage += 1
        if self.stage == 1:
            return Step("", tuple(calls + [_write("solution.py", _imports(self.names))]))
        if self.stage == 2:
            check = _check("from solution import *\n", self.names, self.examples)
            return Step("", (_write("check.py", check), ("run_code", {"path": "check.py"})))
        return Step("", (("submit", {}),))


class EngineerActor:
    def __init__(self, start: Start, silent: bool = False):
        self.silent = silent
        _, examples = _task(start.context)
        m = _ROLE.search(start.role)
        if m is None:
            raise ValueError(f"software teacher: engineer role {start.role!r} names no part")
        self.names = m.group(1).split()
        self.examples = examples
        self.todo = list(self.names)
        self.stage = "parts"

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.todo:
            name, self.todo = self.todo[0], self.todo[1:]
            return Step("", (_part(name),))
        if self.stage == "parts":
            self.stage = "checked"
            check = f"check_{self.names[0]}.py"
            code = _check(_imports(self.names), self.names, self.examples)
            return Step("", (_write(check, code), ("run_code", {"path": check})))
        if self.stage == "checked" and not self.silent:
            self.stage = "reported"
            evidence = [f"file:part_{n}.py" for n in self.names]
            return Step("", (("report_to_ceo", {"status": "done", "done": " ".join(self.names),
                                                "evidence": evidence}),
                             ("wait_for_messages", {})))
        return Step("", (("wait_for_messages", {}),))


def cast(start: Start, silent: bool = False):
    if start.key.agent == "ceo":
        return CeoActor(start, silent)
    return EngineerActor(start, silent)
