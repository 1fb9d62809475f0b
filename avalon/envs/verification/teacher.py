"""The scripted teacher organisation of the verification environment.

The CEO reads the items and clock from its role card and the budget from its first
observation. With probability `verifier_rate` (when the budget allows) it hires a `Verifier`
first (a1: it must exist before a builder's first result); the other hires are `Builder`s, the
items dealt round-robin (role `Build p1 p3. Send results to a1.`); with no builders the CEO
builds everything itself.
- A builder builds its items one per turn (a build's result code shows in the next
  observation) and passes each result on: to the verifier (`p2 47`) when there is one, else in
  a report to the CEO. A `p2 defect` DM from the verifier puts p2 back on its list.
- The verifier reviews every result it is sent (it did not build them, so its review tells the
  truth) and DMs the CEO `p2 47 ok`, or the builder `p2 defect`.
- The CEO ships what the verifier passed; with no verifier it ships every result blind when a
  blind ship is worth it at the task's defect rate (`VerificationConfig.blind_value` > 0), else
  nothing. The episode ends
  when every item is shipped (the environment's terminal event) or by the clock.
The silent organisation (`silent=True`, the `org_silent` baseline): builders are hired and
build, but nobody passes a result on, so the CEO builds and ships everything itself, blind.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from avalon.envs.teacher import Start, budget, chunks, dms, reports, results
from avalon.org.policy import AgentView, Step
from avalon.validation import FieldChecks

TEACHER_WORDS = ("Plan", "Builder", "Verifier", "Build", "Send", "results", "to", "Report",
                 "Review", "what", "you", "get", "hire", "title", "role", "tools", "dm", "text",
                 "report_to_ceo", "status", "done", "wait_for_messages", "ceo", "ok", "defect",
                 "verifier", "builders", "none")
ITEMS = re.compile(r"\b(p\d+) work (\d+)")
_CODE = re.compile(r"\b(p\d+) (\d\d)( ok)?\b")
_DEFECT = re.compile(r"^(p\d+) defect$")
_BUILT = re.compile(r"^(p\d+) built (\d\d)$")
_REVIEWED = re.compile(r"^(p\d+) (\d\d) (ok|defect)$")
_SEND = re.compile(r"Send results to (a\d+)\.")
_RATE = re.compile(r"(\d+) percent of builds are defective")


@dataclasses.dataclass(frozen=True)
class VerifyTeacherConfig:
    verifier_rate: float = 0.5  # chance the CEO hires a verifier (room for RL to move it)
    silent: bool = False  # no messages or reports (see the module docstring)
    hires_per_turn: int = 2

    def __post_init__(self):
        check = FieldChecks("VerifyTeacherConfig")
        if not 0 <= self.verifier_rate <= 1:
            check.fail("verifier_rate", self.verifier_rate, "must be in [0, 1]")
        if self.hires_per_turn < 1:
            check.fail("hires_per_turn", self.hires_per_turn, "must be >= 1")


DEFAULT_TEACHER = VerifyTeacherConfig()


def _items(context: str) -> list[str]:
    items = [m.group(1) for m in ITEMS.finditer(context)]
    if not items:
        raise ValueError("verification teacher: no items in the role card")
    return items


class _Builder:
    """Builds a list one item per turn; hands each result to `send(item, code)`."""

    def __init__(self, todo: list[str]):
        self.todo = list(todo)
        self.built: list[tuple[str, str]] = []  # results not handed on yet

    def observe(self, obs: str) -> None:
        for r in results(obs):
            m = _BUILT.match(r.text)
            if r.tool == "build" and not r.error and m:
                self.built.append((m.group(1), m.group(2)))
        for _, text in dms(obs):
            m = _DEFECT.match(text)
            if m and m.group(1) not in self.todo:
                self.todo.append(m.group(1))

    def next_build(self) -> list:
        if not self.todo:
            return []
        item, self.todo = self.todo[0], self.todo[1:]
        return [("build", {"id": item})]


class BuilderActor:
    def __init__(self, start: Start, silent: bool):
        words = start.role.split(".")[0].split()
        self.work = _Builder(words[1:] if words[:1] == ["Build"] else [])
        m = _SEND.search(start.role)
        self.verifier = m.group(1) if m else None
        self.silent = silent

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        self.work.observe(view.obs)
        calls: list = []
        for item, code in self.work.built:
            if self.silent:
                continue
            if self.verifier:
                calls.append(("dm", {"to": self.verifier, "text": f"{item} {code}"}))
            else:
                calls.append(("report_to_ceo", {"status": "built", "done": f"{item} {code}"}))
        self.work.built = []
        build = self.work.next_build()
        calls += build or [("wait_for_messages", {})]
        return Step("", tuple(calls))


class VerifierActor:
    def __init__(self, start: Start):
        self.queue: list[tuple[str, str, str]] = []  # (item, code, sender)
        self.builder: dict[tuple[str, str], str] = {}

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        calls: list = []
        for r in results(view.obs):
            m = _REVIEWED.match(r.text)
            if r.tool != "review" or r.error or not m:
                continue
            item, code, verdict = m.groups()
            if verdict == "ok":
                calls.append(("dm", {"to": "ceo", "text": f"{item} {code} ok"}))
            else:
                calls.append(("dm", {"to": self.builder[item, code], "text": f"{item} defect"}))
        for sender, text in dms(view.obs):
            m = _CODE.match(text)
            if m and not m.group(3):
                self.builder[m.group(1), m.group(2)] = sender
                calls.append(("review", {"id": m.group(1), "result": m.group(2)}))
        if not any(name == "review" for name, _ in calls):  # else read the verdicts next turn
            calls.append(("wait_for_messages", {}))
        return Step("", tuple(calls))


class CeoActor:
    def __init__(self, start: Start, blind_value, config: VerifyTeacherConfig):
        self.items = _items(start.context)
        rate = _RATE.search(start.context)
        if rate is None:
            raise ValueError("verification teacher: no defect rate in the role card")
        self.blind = blind_value(int(rate.group(1)) / 100) > 0
        self.config = config
        self.hires: list | None = None
        self.verifier: str | None = None
        self.own: _Builder | None = None
        self.shipped: set[str] = set()

    def _plan(self, b: int, rng: np.random.Generator) -> Step:
        cfg = self.config
        with_verifier = not cfg.silent and b >= 1 and rng.random() < cfg.verifier_rate
        n_builders = min(len(self.items), b - with_verifier)
        lists = [self.items[i::n_builders] for i in range(n_builders)] if n_builders else []
        self.verifier = "a1" if with_verifier else None  # hired first: builders tell it
        send = f" Send results to {self.verifier}." if self.verifier else (
            "" if cfg.silent else " Report results.")
        self.hires = [("hire", {"title": "Builder", "role": f"Build {' '.join(lst)}.{send}",
                                "tools": ["build"]}) for lst in lists]
        if with_verifier:
            self.hires.insert(0, ("hire", {"title": "Verifier", "role": "Review what you get.",
                                           "tools": ["review"]}))
        # Alone, or silent: the CEO builds everything itself.
        self.own = _Builder(self.items if cfg.silent or not n_builders else [])
        text = f"Plan: {n_builders} builders; verifier {self.verifier or 'none'}."
        return Step(text, tuple(self._hire()))

    def _hire(self) -> list:
        batch = chunks(self.hires, self.config.hires_per_turn)
        if not batch:
            return []
        self.hires = self.hires[len(batch[0]):]
        return batch[0]

    def _ship(self, item: str, code: str) -> list:
        if item in self.shipped:
            return []
        self.shipped.add(item)
        return [("ship", {"id": item, "result": code})]

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.hires is None:
            b = budget(view.obs)
            if b is None:
                raise ValueError("verification teacher: no budget in the first observation")
            return self._plan(b, rng)
        calls = self._hire()
        self.own.observe(view.obs)
        for item, code in self.own.built:  # the CEO's own results
            if self.verifier:
                calls.append(("dm", {"to": self.verifier, "text": f"{item} {code}"}))
            elif self.blind:
                calls += self._ship(item, code)
        self.own.built = []
        for _, text in dms(view.obs) + reports(view.obs):
            for m in _CODE.finditer(text):
                if m.group(3) or (not self.verifier and self.blind):
                    calls += self._ship(m.group(1), m.group(2))
        build = self.own.next_build()
        calls += build
        if not build and not self.hires:
            calls.append(("wait_for_messages", {}))
        return Step("", tuple(calls))


def cast(env_config, config: VerifyTeacherConfig):
    """The actor factory for `TeacherPolicy` (`env_config`: the VerificationConfig)."""
    def make(start: Start):
        if start.key.agent == "ceo":
            return CeoActor(start, env_config.blind_value, config)
        if start.title == "Verifier":
            return VerifierActor(start)
        return BuilderActor(start, config.silent)
    return make
