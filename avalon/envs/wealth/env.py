"""Environment 4: wealth. Repeated bets whose edges the organisation must research before
sizing them; scored as the final wealth ratio W_T / W_0 through GKPO (`Objective.GKPO`).

A task is n even-money bets b1..bn with hidden win chances p_i (|2 p_i - 1|, the edge, drawn
from `edge_range`, its sign at random: about half the bets are worth skipping). Tools:
- `research(id)` (grantable): `research_trials` fresh past trials of that bet, `b2: 14 wins in
  20 trials`; declared duration `research_cost_s`;
- `bet(id, fraction)` (CEO only): stakes fraction * W; a win adds the stake, a loss removes it;
  declared duration `bet_cost_s`. Once per bet (fraction 0 settles it too); the episode ends
  (terminal) when every bet is settled.
Hardening: fraction must be a number in [0, max_fraction] (max_fraction <= 1, so wealth never
goes negative; NaN and booleans are refused), unknown or settled bets are refused, and each
bet's outcome is drawn when the session opens (from the session seed), so neither the order of
calls nor research can steer it. Research samples come from a stream per bet. `on_end` reports
W_T / W_0 whatever ended the episode, and the final utility u_beta(W_T / W_0) = (x^beta - 1) /
beta as a reward event (label `utility`, beta = `utility_beta`) so that reward metrics, the
learning-progress sampler and evaluation see the outcome; there are no per-call rewards.
Success (`env/success`, the sampler's score) is a wealth ratio above 1.

Common random numbers: outcomes and research samples depend only on the session seed and the
task, so sessions opened with one seed (the K rollouts of a group, `avalon/envs/base.py`
`group_seeds`) meet the same outcome sequence and their advantages compare policies, not luck.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from avalon.envs.table import TableEnv
from avalon.envs.teacher import Baselines, TeacherPolicy, chance_policy
from avalon.envs.wealth.tasks import (
    DEFAULT_CONFIG,
    WealthConfig,
    WealthTask,
    make_task,
    prompt,
)
from avalon.envs.wealth.teacher import BETS_LINE, TEACHER_WORDS, cast
from avalon.org.env import (
    CallContext,
    EndContext,
    EnvReward,
    FinalOutcome,
    Param,
    ParamType,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.workspace import Workspace
from avalon.rl.types import Objective
from avalon.tokenizer.chat import ChatFormat

RESEARCH = ToolSpec("research", "past trials of one bet; takes time", (
    Param("id", ParamType.STRING, "bet id, e.g. b2"),))
BET = ToolSpec("bet", "stake a fraction of wealth on one bet, once", (
    Param("id", ParamType.STRING, "bet id"),
    Param("fraction", ParamType.NUMBER, "share of current wealth, 0 to max")), grantable=False)


def _probs(task: WealthTask) -> tuple[float, ...]:
    """A task's content signature: its bets' win chances."""
    return task.probs


class WealthSession:
    def __init__(self, task_id: str, spec: WealthTask, seed: int, clock_s: float,
                 config: WealthConfig):
        self.spec, self.config = spec, config
        self.ids = [f"b{i + 1}" for i in range(len(spec.probs))]
        key = zlib.crc32(task_id.encode())
        draws = np.random.default_rng([seed, key, 0]).random(len(spec.probs))
        self.wins = {b: bool(u < p) for b, u, p in zip(self.ids, draws, spec.probs)}
        self.research_rng = {b: np.random.default_rng([seed, key, 1, i])
                             for i, b in enumerate(self.ids)}
        self.wealth = config.start_wealth
        self.settled: dict[str, float] = {}  # bet -> fraction staked
        self.research_calls = 0
        self._task = Task(task_id=task_id, prompt=prompt(spec, config, clock_s),
                          tools=(RESEARCH, BET), wall_clock_s=clock_s,
                          objective=Objective.GKPO)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def _bet_id(self, args: dict) -> str:
        bid = args["id"].strip()
        if bid not in self.wins:
            raise ToolError(f"no bet {args['id']!r}; bets are b1..b{len(self.ids)}")
        return bid

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool == "research":
            bid = self._bet_id(args)
            n = self.config.research_trials
            wins = int((self.research_rng[bid].random(n) < self.spec.probs[int(bid[1:]) - 1])
                       .sum())
            self.research_calls += 1
            return ToolOutcome(f"{bid}: {wins} wins in {n} trials",
                               duration_s=self.config.research_cost_s)
        if tool != "bet":
            raise ToolError(f"unknown tool {tool!r}")
        bid = self._bet_id(args)
        if bid in self.settled:
            raise ToolError(f"{bid} is already settled")
        f = args["fraction"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or \
                not 0 <= f <= self.config.max_fraction:
            raise ToolError(f"fraction must be a number in [0, {self.config.max_fraction:g}], "
                            f"got {f!r}")
        stake = f * self.wealth
        won = self.wins[bid]
        self.wealth = self.wealth + stake if won else max(0.0, self.wealth - stake)
        self.settled[bid] = float(f)
        return ToolOutcome(f"{bid} {'won' if won else 'lost'}, wealth {self.wealth:.2f}",
                           terminal=len(self.settled) == len(self.ids),
                           duration_s=self.config.bet_cost_s)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        ratio = self.wealth / self.config.start_wealth
        beta = self.config.utility_beta
        utility = (ratio ** beta - 1) / beta
        return FinalOutcome(rewards=(EnvReward(utility, "utility"),), wealth_ratio=ratio,
                            metrics={"bets": float(len(self.settled)),
                                     "research": float(self.research_calls),
                                     "wealth": self.wealth, "success": float(ratio > 1)})


class Wealth(TableEnv[WealthConfig, WealthTask, WealthSession]):
    """Environment 4 (see the module docstring). Sessions use their seed for outcomes and
    research samples."""

    name = "wealth"

    def __init__(self, config: WealthConfig = DEFAULT_CONFIG):
        super().__init__(config, make_task, _probs)

    def _open(self, task_id: str, spec: WealthTask, seed: int, clock_s: float,
              config: WealthConfig) -> WealthSession:
        return WealthSession(task_id, spec, seed, clock_s, config)

    def teacher(self, chat: ChatFormat, kelly_scale: float = 0.5,
                overhead_s: float = 30.0, silent: bool = False) -> TeacherPolicy:
        """The scripted teacher organisation (`teacher.py`): research, then fractional Kelly;
        `silent`: researchers never report (the CEO researches what it can itself)."""
        return TeacherPolicy(chat, cast(self.config, kelly_scale, overhead_s, silent))

    def baselines(self, chat: ChatFormat) -> Baselines:
        """Reference organisations: chance stakes a uniform fraction on random bets; the
        teacher alone, silent and whole."""
        top = self.config.max_fraction

        def draw(context: str, rng: np.random.Generator) -> tuple:
            bets = BETS_LINE.search(context).group(1).split()
            return "bet", {"id": bets[int(rng.integers(len(bets)))],
                           "fraction": round(float(rng.uniform(0, top)), 3)}

        return Baselines(chance=lambda: chance_policy(chat, draw, self.config.n_bets[1]),
                         single=lambda: self.teacher(chat),
                         org_silent=lambda: self.teacher(chat, silent=True),
                         org=lambda: self.teacher(chat))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float | None:
        return None  # outcomes are random; no closed form for the best research plan

    def vocabulary(self) -> tuple[str, ...]:
        words = ["Bets", "pay", "even", "money", "staking", "fraction", "of", "your", "wealth",
                 "wins", "or", "loses", "Win", "chances", "are", "unknown", "research", "id",
                 "shows", "past", "trials", "and", "takes", "bet", "stakes", "once", "per",
                 "to", "Score", "final", "Clock", "in", "won", "lost", "no", "bets", "is",
                 "already", "settled", "must", "be", "number", "got",
                 *(f"b{i}" for i in range(1, 10)), *(str(i) for i in range(10, 100)),
                 *TEACHER_WORDS]
        return tuple(dict.fromkeys(words))
