"""Scripted teacher organisations: the policy behind every environment's `teacher(...)`.

A teacher is an org `Policy` whose agents are deterministic `Actor`s. It reads what the model
would read and nothing else: an actor is cast from its agent's first prompt as text (the role
card `AgentView.system`: task prompt, private brief, roster, tools; and the first observation), then
sees each turn's `AgentView` (observation, title, role) and a random generator seeded by the
turn's sampling seed. Information moves between actors only through the simulator (hire roles,
messages, reports, tool results), so the traces are valid SFT data, and a teacher plays sessions
served over ORS exactly as in-process ones.

Helpers below parse the simulator's observation lines (`avalon/org/prompts.py`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from avalon.org.policy import AgentKey, AgentView, Step, Turn, TurnOutput, scripted_output
from avalon.org.toolcall import format_call
from avalon.tokenizer.chat import ChatFormat

_RESULT = re.compile(r"^\[#(\d+) ([a-z][a-z0-9_]*)( error)?\] ?(.*)$")
_BUDGET = re.compile(r"Budget: (\d+) hires")
_DM = re.compile(r"^dm (\S+) m\d+: (.*)$")
_REPORT = re.compile(r"^report (\S+) m\d+: (.*)$")


@dataclasses.dataclass(frozen=True)
class Start:
    """What an actor is cast from: its agent's first prompt, as text."""

    key: AgentKey
    context: str  # the role card (task, brief, roster, tools) and the first observation
    title: str
    role: str


class Actor(Protocol):
    def step(self, view: AgentView, rng: np.random.Generator) -> Step: ...


class TeacherPolicy:
    """Runs one `Actor` per agent (cast on its first turn); outputs in the chat format."""

    def __init__(self, chat: ChatFormat, cast: Callable[[Start], Actor],
                 summary_text: str = "Summary: I keep to my plan."):
        self.chat, self.cast, self.summary_text = chat, cast, summary_text
        self._actors: dict[AgentKey, Actor] = {}
        self.cut_turns = 0  # outputs longer than the turn's limit (cut: a teacher bug to fix)

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        out = []
        for turn in turns:
            actor = self._actors.get(turn.key)
            if actor is None:
                context = f"{turn.view.system}\n{turn.view.obs}"
                actor = self.cast(Start(turn.key, context, turn.view.title, turn.view.role))
                self._actors[turn.key] = actor
            if turn.view.summary:
                step = Step(self.summary_text)
            else:
                step = actor.step(turn.view, np.random.default_rng(turn.seed))
            ids = self.chat.output(step.text, [format_call(n, a, json_call=self.chat.json_calls)
                                               for n, a in step.calls])
            self.cut_turns += len(ids) > turn.max_new_tokens
            out.append(scripted_output(ids, turn.max_new_tokens))
        return out

    def release(self, key: AgentKey) -> None:
        self._actors.pop(key, None)

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Result:
    """One tool result line of an observation: `[#12 solve] s1 correct`."""

    seq: int
    tool: str
    error: bool
    text: str


def results(obs: str) -> list[Result]:
    """The tool results in an observation, in order."""
    out = []
    for line in obs.splitlines():
        m = _RESULT.match(line)
        if m:
            out.append(Result(int(m.group(1)), m.group(2), m.group(3) is not None, m.group(4)))
    return out


def budget(obs: str) -> int | None:
    """The hire budget from the CEO's first observation (`Start. Budget: 3 hires.`)."""
    m = _BUDGET.search(obs)
    return int(m.group(1)) if m else None


def dms(obs: str) -> list[tuple[str, str]]:
    """(sender, text) of each direct message delivered in an observation."""
    return [(m.group(1), m.group(2)) for line in obs.splitlines() if (m := _DM.match(line))]


def reports(obs: str) -> list[tuple[str, str]]:
    """(sender, text) of each `report_to_ceo` delivered in an observation."""
    return [(m.group(1), m.group(2)) for line in obs.splitlines() if (m := _REPORT.match(line))]


def chunks(items: Sequence, size: int) -> list[list]:
    """`items` in consecutive lists of at most `size` (a turn holds a few calls)."""
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


@dataclasses.dataclass(frozen=True)
class Baselines:
    """An environment's scripted reference organisations (`avalon/tools/env_baselines.py`),
    each a fresh `Policy` per call and the budget it plays at (None: the evaluation budget).

    - `chance`: uniform valid actions, one agent;
    - `single`: the best scripted single agent (b = 0);
    - `org_silent`: the best scripted organisation that hires and works in parallel but never
      sends a message, posts, reacts, reports or reads a trace;
    - `org`: the teacher organisation.
    """

    chance: Callable[[], TeacherPolicy]
    single: Callable[[], TeacherPolicy]
    org_silent: Callable[[], TeacherPolicy]
    org: Callable[[], TeacherPolicy]

    def policies(self) -> tuple[tuple[str, Callable[[], TeacherPolicy], int | None], ...]:
        """(name, policy factory, budget or None for the evaluation budget), in report order."""
        return (("chance", self.chance, 0), ("single", self.single, 0),
                ("org_silent", self.org_silent, None), ("org", self.org, None))


class ChanceActor:
    """Uniform valid actions: each turn one environment call drawn by `draw(context, rng)` (the
    agent's first prompt as text), and after `turns` calls the final message."""

    def __init__(self, start: Start, draw: Callable[[str, np.random.Generator], tuple],
                 turns: int):
        self.context, self.draw, self.turns, self.done = start.context, draw, turns, 0

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if view.turn == 0:  # plan mode refuses environment tools in the first turn
            return Step("Plan: try things.")
        if self.done >= self.turns:
            return Step("", (("final_message", {"text": "done"}),))
        self.done += 1
        return Step("", (self.draw(self.context, rng),))


def chance_policy(chat: ChatFormat, draw: Callable[[str, np.random.Generator], tuple],
                  turns: int) -> TeacherPolicy:
    """A `TeacherPolicy` of `ChanceActor`s (one agent: run it at b = 0)."""
    return TeacherPolicy(chat, lambda start: ChanceActor(start, draw, turns))
