"""The scripted organisation of an OpenSpiel game: every seat plays a table policy.

The CEO reads its seats from its brief (`Seats: hire a1 plays seat 0; you play seat 1.`) and,
in its first turn, hires the players the brief names (title `Player`, role `Play seat k.`, the
tools observe and act). From then on every agent does the same thing each turn: for each line
of its observation that says one of its seats is to move (`seat 1 to move: legal ...; view
V`), it acts for that seat with the policy's action at (seat, V) (sampled when the policy
mixes; uniform over the legal ids where the policy has no row), or, with probability `noise`,
with a uniform legal action; with no seat to move it observes again. It never talks (so it
plays the same with and without `Permissions.talk`), and reads only its own observations: the
traces are valid SFT data, and it plays sessions served over ORS as well.

The policy is `solve.teacher_source(game)` (the team optimum, CFR, or uniform).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from avalon.envs.openspiel.solve import TablePolicy
from avalon.envs.teacher import Start, TeacherPolicy, chunks
from avalon.org.policy import AgentView, Step
from avalon.tokenizer.chat import ChatFormat
from avalon.validation import FieldChecks

TEACHER_WORDS = ("Plan", "players", "play", "every", "seat", "Player", "Play", "observe", "act",
                 "hire", "title", "role", "tools", "action")
_SEAT = re.compile(r"(?:^|\] )seat (\d+) to move: legal (.*?); view (.*)$")
_HIRE = re.compile(r"hire (a\d+) plays seat (\d+)")
_ACTION_ID = re.compile(r"^(\d+) ")


@dataclasses.dataclass(frozen=True)
class GameTeacherConfig:
    noise: float = 0.0  # chance a move is uniform over the legal actions instead of the policy's
    hires_per_turn: int = 1  # one hire a turn keeps a toy's turns short

    def __post_init__(self):
        check = FieldChecks("GameTeacherConfig")
        if not 0 <= self.noise <= 1:
            check.fail("noise", self.noise, "must be in [0, 1]")
        if isinstance(self.hires_per_turn, bool) or not isinstance(self.hires_per_turn, int) \
                or self.hires_per_turn < 1:
            check.fail("hires_per_turn", self.hires_per_turn, "must be an int >= 1")


def seats_to_move(obs: str) -> list[tuple[int, list[int], str]]:
    """(seat, legal action ids, view) of every `seat k to move` line of an observation."""
    out = []
    for line in obs.splitlines():
        m = _SEAT.search(line)
        if m:
            ids = [int(a.group(1)) for piece in m.group(2).split(", ")
                   if (a := _ACTION_ID.match(piece))]
            out.append((int(m.group(1)), ids, m.group(3)))
    return out


class SeatActor:
    """One agent of the teacher organisation (see the module docstring)."""

    def __init__(self, start: Start, policy: TablePolicy, config: GameTeacherConfig):
        self.policy, self.config = policy, config
        self.planned = start.key.agent != "ceo"
        self.hires: list = []
        if not self.planned:
            self.hires = [("hire", {"title": "Player", "role": f"Play seat {seat}.",
                                    "tools": ["observe", "act"]})
                          for _, seat in _HIRE.findall(start.context)]

    def _choose(self, seat: int, legal: list[int], view: str, rng: np.random.Generator) -> int:
        row = self.policy.get((seat, view))
        if rng.random() < self.config.noise or not row:
            return int(legal[int(rng.integers(len(legal)))])
        actions = [a for a, _ in row]
        p = np.array([q for _, q in row], np.float64)
        return int(actions[int(rng.choice(len(actions), p=p / p.sum()))])

    def _next_hires(self) -> list:
        batch = chunks(self.hires, self.config.hires_per_turn)
        if not batch:
            return []
        self.hires = self.hires[len(batch[0]):]
        return batch[0]

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if not self.planned:  # the CEO's first turn (plan mode: no game tools yet)
            self.planned = True
            text = f"Plan: {len(self.hires)} players." if self.hires else \
                "Plan: I play every seat."
            return Step(text, tuple(self._next_hires()))
        calls = self._next_hires()
        for seat, legal, seen in seats_to_move(view.obs):
            if legal:
                calls.append(("act", {"action": self._choose(seat, legal, seen, rng),
                                      "seat": seat}))
        if not any(name == "act" for name, _ in calls):
            calls.append(("observe", {}))
        return Step("", tuple(calls))


def game_teacher(chat: ChatFormat, policy: TablePolicy,
                 config: GameTeacherConfig = GameTeacherConfig()) -> TeacherPolicy:
    return TeacherPolicy(chat, lambda start: SeatActor(start, policy, config))
