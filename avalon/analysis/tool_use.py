"""How a model uses the organisation's tools, read from event logs: the first thing to know of
a real (pretrained) model dropped into the harness, before any of SPEC §5's measures.

Per group of rollouts (an environment and an arm, at one checkpoint):
- turns: the agents' model calls (summary turns and skipped turns excluded); `well_formed`:
  those whose output parsed (no `malformed` field); `with_calls`: well-formed turns that ran at
  least one call;
- per tool: attempts = the calls that parsed (`tool_call` events) plus the malformed turns
  whose text names the tool (`"name": "post"` or `<tool_call>post`; the rest count under
  `(unparsed)`), `parsed` = the calls that parsed, `ok` = those that ran without a tool error;
  the per-tool well-formed share is parsed / attempts;
- hires per organisation rollout and the hired titles (normalised to lower case);
- the collective reward per rollout.

Counts are sums over rollouts; `summary()` gives shares with Wilson intervals and means with
standard errors (rollout as the unit), the numbers the real-model tables of RESULTS.md print.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping

from avalon.analysis.logs import LoggedRollout
from avalon.analysis.stats import wilson

UNPARSED = "(unparsed)"
# A tool named in a malformed turn's text: the JSON call's name, or the native grammar's.
_NAMED = (re.compile(r'"name"\s*:\s*"([a-z][a-z0-9_]*)"'),
          re.compile(r"<tool_call>\s*([a-z][a-z0-9_]*)"))


@dataclasses.dataclass
class ToolStats:
    attempts: int = 0
    parsed: int = 0
    ok: int = 0


@dataclasses.dataclass
class ToolUse:
    """Counts over a set of rollouts (see the module docstring)."""

    rollouts: int = 0
    turns: int = 0
    well_formed: int = 0
    with_calls: int = 0
    tools: dict[str, ToolStats] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(ToolStats))
    hires: list[int] = dataclasses.field(default_factory=list)  # per rollout
    titles: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rewards: list[float] = dataclasses.field(default_factory=list)

    def add(self, rollout: LoggedRollout) -> None:
        self.rollouts += 1
        calls_by_turn: dict[int, int] = collections.Counter()
        for e in rollout.events:
            if e["kind"] == "tool_call" and e.get("cause") is not None:
                calls_by_turn[e["cause"]] += 1
        hires = 0
        for e in rollout.events:
            kind = e["kind"]
            if kind == "model_call" and not e.get("summary") and not e.get("skipped"):
                self.turns += 1
                if e.get("malformed"):
                    self.tools[_named_tool(e.get("text") or "")].attempts += 1
                else:
                    self.well_formed += 1
                    self.with_calls += calls_by_turn.get(e["seq"], 0) > 0
            elif kind == "tool_call":
                t = self.tools[e["tool"]]
                t.attempts += 1
                t.parsed += 1
                t.ok += not e.get("error")
            elif kind == "hire":
                hires += 1
                self.titles[" ".join(str(e.get("title", "")).lower().split())] += 1
        self.hires.append(hires)
        self.rewards.append(rollout.reward)

    def summary(self) -> dict:
        """Shares (with 95% Wilson intervals) and means (with standard errors)."""
        def share(k: int, n: int) -> dict:
            iv = wilson(k, n)
            return {"k": k, "n": n, "share": iv.estimate if n else None, "low": iv.low,
                    "high": iv.high}

        return {
            "rollouts": self.rollouts,
            "well_formed_turns": share(self.well_formed, self.turns),
            "turns_with_calls": share(self.with_calls, self.turns),
            "tools": {name: {"attempts": t.attempts,
                             "well_formed": share(t.parsed, t.attempts),
                             "ran_ok": share(t.ok, t.attempts)}
                      for name, t in sorted(self.tools.items(), key=lambda kv: -kv[1].attempts)},
            "hires": mean_se(self.hires),
            "titles": dict(self.titles.most_common()),
            "reward": mean_se(self.rewards),
        }


def _named_tool(text: str) -> str:
    for pattern in _NAMED:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return UNPARSED


def mean_se(values: list[float]) -> dict:
    """{mean, se, n}: the standard error with ddof 1 (None below two values)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "se": None, "n": 0}
    mean = sum(values) / n
    se = None
    if n > 1:
        se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return {"mean": mean, "se": se, "n": n}


def tool_use_by_group(rollouts: Iterable[LoggedRollout]) -> Mapping[tuple, ToolUse]:
    """{(phase, step, env, arm): ToolUse} over `rollouts` (`logs.read_run`)."""
    out: dict[tuple, ToolUse] = collections.defaultdict(ToolUse)
    for r in rollouts:
        out[(r.phase, r.step, r.env, r.arm)].add(r)
    return dict(out)
