"""Wealth tasks: the configuration, the hidden win chances, the prompt (rules in `env.py`)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from avalon.rl.config import GKPO_BETA
from avalon.validation import FieldChecks

RESEARCH_LINE = re.compile(r"\b(b\d+): (\d+) wins in (\d+) trials")


@dataclasses.dataclass(frozen=True)
class WealthConfig:
    n_bets: tuple[int, int] = (4, 6)  # inclusive range
    edge_range: tuple[float, float] = (0.3, 0.6)  # |2p - 1|
    research_trials: int = 20
    research_cost_s: float = 60.0
    bet_cost_s: float = 5.0
    max_fraction: float = 1.0
    start_wealth: float = 100.0
    # The final utility u_beta(W_T / W_0) is reported as a reward event (label `utility`), so
    # reward metrics, the learning-progress sampler and evaluation see it; keep beta equal to
    # the GKPO loss's `rl.beta` (GKPO advantages read the wealth ratio itself).
    utility_beta: float = GKPO_BETA
    clock_s: float = 240.0
    n_train: int = 512
    n_heldout: int = 64
    seed: int = 0

    def __post_init__(self):
        check = FieldChecks("WealthConfig")
        if not 1 <= self.n_bets[0] <= self.n_bets[1] <= 9:
            check.fail("n_bets", self.n_bets, "must be 1 <= lo <= hi <= 9")
        if not 0 <= self.edge_range[0] <= self.edge_range[1] < 1:
            check.fail("edge_range", self.edge_range, "must be 0 <= lo <= hi < 1")
        if not 0 < self.max_fraction <= 1:
            check.fail("max_fraction", self.max_fraction, "must be in (0, 1] (no negative wealth)")
        if not self.utility_beta > 0:
            check.fail("utility_beta", self.utility_beta, "must be > 0")
        if self.research_trials < 1:
            check.fail("research_trials", self.research_trials, "must be >= 1")
        for name in ("research_cost_s", "bet_cost_s", "start_wealth", "clock_s"):
            if not getattr(self, name) > 0:
                check.fail(name, getattr(self, name), "must be > 0")


DEFAULT_CONFIG = WealthConfig()


@dataclasses.dataclass(frozen=True)
class WealthTask:
    probs: tuple[float, ...]  # win chance of b1..bn


def make_task(rng: np.random.Generator, config: WealthConfig) -> WealthTask:
    n = int(rng.integers(config.n_bets[0], config.n_bets[1] + 1))
    lo, hi = config.edge_range
    edges = rng.uniform(lo, hi, size=n) * rng.choice([-1.0, 1.0], size=n)
    return WealthTask(tuple(round(0.5 + e / 2, 3) for e in edges))


def prompt(task: WealthTask, config: WealthConfig, clock_s: float) -> str:
    ids = " ".join(f"b{i + 1}" for i in range(len(task.probs)))
    return (f"Bets {ids} pay even money: staking a fraction f of your wealth wins f or loses f. "
            f"Win chances are unknown; research id shows {config.research_trials} past trials "
            f"and takes {round(config.research_cost_s)} s. bet id fraction stakes once per bet "
            f"(fraction 0 to {config.max_fraction:g}, {round(config.bet_cost_s)} s). Score: "
            f"final wealth / {config.start_wealth:g}. Clock {round(clock_s)}.")

