"""The scripted teacher organisation of the wealth environment: research, then fractional Kelly.

The CEO reads the bets and clock from its role card and hires min(budget, n) researchers
(`Researcher`, tool `research`), dealing the bets round-robin (role `Research b1 b3.`). Each
agent researches at most as many bets as fit before the clock while leaving time for every bet
(`affordable`), one per turn, and a researcher then reports its results to the CEO. With no
hires the CEO researches what fits itself. Once every hire has reported, the CEO estimates each
researched bet's win chance as (wins + 1) / (trials + 2) and stakes `kelly_scale` times the
Kelly fraction for even money, max(0, 2p - 1); unresearched bets and bets without an edge get
fraction 0, which settles them, so the episode ends when the last bet is placed.

The silent organisation (`silent=True`, the `org_silent` baseline): researchers are hired and
research but never report, so the CEO researches what fits itself, as a single agent does, and
bets on what it saw.
"""

from __future__ import annotations

import math
import re

import numpy as np

from avalon.envs.teacher import Start, budget, chunks, reports
from avalon.envs.wealth.tasks import RESEARCH_LINE, WealthConfig
from avalon.org.policy import AgentView, Step

TEACHER_WORDS = ("Plan", "Researcher", "Research", "hire", "title", "role", "tools",
                 "report_to_ceo", "status", "done", "wait_for_messages", "ceo")
BETS_LINE = re.compile(r"Bets ((?:b\d+ ?)+) pay")
_CLOCK = re.compile(r"Clock (\d+)")
HIRES_PER_TURN = 2
BETS_PER_TURN = 4


def affordable(config: WealthConfig, n_bets: int, clock_s: float, overhead_s: float) -> int:
    """Research calls one agent fits before the clock, leaving time to place every bet."""
    spare = clock_s - overhead_s - n_bets * config.bet_cost_s
    return max(0, math.floor(spare / config.research_cost_s))


def _read_task(context: str) -> tuple[list[str], float]:
    bets, clock = BETS_LINE.search(context), _CLOCK.search(context)
    if bets is None or clock is None:
        raise ValueError("wealth teacher: no bets and clock in the role card")
    return bets.group(1).split(), float(clock.group(1))


def _research(bets: list[str]) -> tuple[str, dict]:
    return "research", {"id": bets[0]}


class CeoActor:
    def __init__(self, start: Start, config: WealthConfig, kelly_scale: float,
                 overhead_s: float, silent: bool = False):
        self.silent = silent
        self.bets, self.clock_s = _read_task(start.context)
        self.config, self.kelly_scale, self.overhead_s = config, kelly_scale, overhead_s
        self.hires: list | None = None
        self.hired = 0
        self.mine: list[str] = []  # bets the CEO researches itself
        self.reported: set[str] = set()
        self.seen: dict[str, tuple[int, int]] = {}  # bet -> (wins, trials)
        self.to_bet: list[tuple[str, float]] | None = None

    def _plan(self, b: int) -> Step:
        fit = affordable(self.config, len(self.bets), self.clock_s, self.overhead_s)
        self.hired = min(b, len(self.bets))
        if self.silent:  # hires research for no one: the CEO researches what fits itself
            self.mine = self.bets[:fit]
        if self.hired == 0:
            self.mine = self.bets[:fit]
            self.hires = []
            return Step(f"Plan: research {' '.join(self.mine) or 'none'} myself.")
        lists = [self.bets[i::self.hired][:fit] for i in range(self.hired)]
        self.hires = [("hire", {"title": "Researcher", "role": f"Research {' '.join(lst)}.",
                                "tools": ["research"]}) for lst in lists]
        text = "Plan: " + "; ".join(f"a{i + 1} {' '.join(lst) or 'none'}"
                                    for i, lst in enumerate(lists)) + "."
        return Step(text, tuple(self._hire()))

    def _hire(self) -> list:
        batch = chunks(self.hires, HIRES_PER_TURN)
        if not batch:
            return []
        self.hires = self.hires[len(batch[0]):]
        return batch[0]

    def _fraction(self, bet: str) -> float:
        if bet not in self.seen:
            return 0.0
        wins, trials = self.seen[bet]
        p = (wins + 1) / (trials + 2)
        f = self.kelly_scale * max(0.0, 2 * p - 1)
        return round(min(f, self.config.max_fraction), 3)

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.hires is None:
            b = budget(view.obs)
            if b is None:
                raise ValueError("wealth teacher: no budget in the first observation")
            return self._plan(b)
        for m in RESEARCH_LINE.finditer(view.obs):
            self.seen[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        self.reported |= {sender for sender, _ in reports(view.obs)}
        calls = self._hire()
        if self.hires:
            return Step("", tuple(calls))
        if self.mine:
            calls.append(_research(self.mine))
            self.mine = self.mine[1:]
            return Step("", tuple(calls))
        if len(self.reported) < self.hired and not self.silent:
            return Step("", tuple(calls + [("wait_for_messages", {})]))
        if self.to_bet is None:
            self.to_bet = [(b, self._fraction(b)) for b in self.bets]
        batch, self.to_bet = self.to_bet[:BETS_PER_TURN], self.to_bet[BETS_PER_TURN:]
        calls += [("bet", {"id": b, "fraction": f}) for b, f in batch]
        if not batch:
            calls.append(("final_message", {"text": "done"}))
        return Step("", tuple(calls))


class ResearcherActor:
    def __init__(self, start: Start, config: WealthConfig, overhead_s: float,
                 silent: bool = False):
        bets, clock = _read_task(start.context)
        role = start.role.removeprefix("Research ").rstrip(".").split()
        self.todo = role[:affordable(config, len(bets), clock, overhead_s)]
        self.results: list[str] = []
        self.reported = silent

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        self.results += [m.group(0) for m in RESEARCH_LINE.finditer(view.obs)]
        if self.todo:
            call = _research(self.todo)
            self.todo = self.todo[1:]
            return Step("", (call,))
        if self.reported:
            return Step("", (("wait_for_messages", {}),))
        self.reported = True
        return Step("", (("report_to_ceo", {"status": "researched",
                                            "done": "; ".join(self.results) or "none"}),
                         ("wait_for_messages", {})))


def cast(config: WealthConfig, kelly_scale: float, overhead_s: float, silent: bool = False):
    def make(start: Start):
        if start.key.agent == "ceo":
            return CeoActor(start, config, kelly_scale, overhead_s, silent)
        return ResearcherActor(start, config, overhead_s, silent)
    return make
