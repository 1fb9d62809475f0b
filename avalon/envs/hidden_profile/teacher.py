"""The scripted teacher organisation of the hidden-profile environment.

The CEO reads the options, the shared facts and the number of analysts m from its role card,
and hires min(budget, m) analysts (`Analyst`, no tools) in its first turn. Each analyst reports
the facts of its brief to the CEO (`report_to_ceo`, the facts in `done`). Once every hire has
reported, the CEO tallies every distinct fact it has seen (good +1, bad -1) and chooses the top
option. With a budget below m it chooses on partial facts, so it is often wrong: the
environment's point.

The silent organisation (`cast(..., silent=True)`, the `org_silent` baseline): the CEO hires the
analysts the same way, but nobody reports, so it chooses on the shared facts alone as soon as
its hires are made; analysts only wait.
"""

from __future__ import annotations

import re

import numpy as np

from avalon.envs.hidden_profile.tasks import FACT, Fact, best_option
from avalon.envs.teacher import Start, budget, chunks, reports
from avalon.org.policy import AgentView, Step

TEACHER_WORDS = ("Analyst", "Report", "your", "to", "ceo", "Tally", "hire", "title", "role",
                 "tools", "report_to_ceo", "status", "done", "wait_for_messages")
OPTIONS_LINE = re.compile(r"Choose the best of ([a-z, ]+):")
# "3 analysts each hold more facts." (today's tasks), "1 analyst holds more facts.", or no
# such sentence (an easier tier with no analyst: 0)
_HOLDERS = re.compile(r"(\d+) analysts? (?:each hold|holds) more facts")
HIRES_PER_TURN = 2


def facts_in(text: str, options) -> list[Fact]:
    return [Fact(m.group(1), m.group(2) == "good", m.group(3)) for m in FACT.finditer(text)
            if m.group(1) in options]


class CeoActor:
    def __init__(self, start: Start, silent: bool = False):
        self.silent = silent
        opts, holders = OPTIONS_LINE.search(start.context), _HOLDERS.search(start.context)
        if opts is None:
            raise ValueError("hidden_profile teacher: no task in the CEO's role card")
        self.options = tuple(o.strip() for o in opts.group(1).split(","))
        known = start.context.split("Known: ", 1)[1].split(". ", 1)[0]
        self.facts = facts_in(known, self.options)
        self.holders = int(holders.group(1)) if holders else 0
        self.hires: list | None = None
        self.hired = 0
        self.reported: set[str] = set()

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.hires is None:
            b = budget(view.obs)
            if b is None:
                raise ValueError("hidden_profile teacher: no budget in the first observation")
            self.hired = min(b, self.holders)
            self.hires = [("hire", {"title": "Analyst", "role": "Report your facts.",
                                    "tools": []}) for _ in range(self.hired)]
            return Step(f"Plan: hire {self.hired}, pool facts, tally.", tuple(self._hire()))
        for sender, text in reports(view.obs):
            self.reported.add(sender)
            self.facts += facts_in(text, self.options)
        calls = self._hire()
        if self.hires or (len(self.reported) < self.hired and not self.silent):
            return Step("", tuple(calls + [("wait_for_messages", {})]))
        choice = best_option(self.options, self.facts)
        return Step("Tally done.", tuple(calls + [("choose", {"option": choice})]))

    def _hire(self) -> list:
        batch = chunks(self.hires, HIRES_PER_TURN)
        if not batch:
            return []
        self.hires = self.hires[len(batch[0]):]
        return batch[0]


class AnalystActor:
    def __init__(self, start: Start, silent: bool = False):
        brief = start.context.split("Brief: ", 1)
        self.facts = brief[1].split("\n", 1)[0] if len(brief) == 2 else ""
        self.reported = silent  # a silent analyst never reports

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.reported:
            return Step("", (("wait_for_messages", {}),))
        self.reported = True
        facts = self.facts.removeprefix("Your facts: ").rstrip(".") or "none"
        return Step("", (("report_to_ceo", {"status": "facts", "done": facts}),
                         ("wait_for_messages", {})))


def cast(start: Start, silent: bool = False):
    if start.key.agent == "ceo":
        return CeoActor(start, silent)
    return AnalystActor(start, silent)
