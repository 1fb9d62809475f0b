"""Host-side rollout data: what the organisation simulator hands to the RL core.

A `RolloutGroup` is K rollouts of one task (K = 16 by default). A `Rollout` is one episode of an
organisation: one `TrajectoryRow` per agent context segment (agents can be hired mid-episode, and
a compaction splits an agent's context into segments, each its own row) plus the reward events
attached to its tool calls. Arrays are numpy; the RL core packs rows into device batches.

Token alignment inside a row (length T):
  tokens[t]        the t-th token of the agent's context
  loss_mask[t]     True where the policy sampled tokens[t] (the agent's own outputs). Prompts,
                   tool results and messages received from teammates carry no loss.
  sampler_logp[t]  log-prob the sampler gave tokens[t] (0 where not sampled)
  routing[t]       the experts every MoE layer chose when tokens[t] was the *input* position
                   ([T, n_moe_layers, k]); replaying them reproduces the sampler's forward
  flags[t]         TokenFlag of the turn that produced tokens[t] (shaping is applied by the RL
                   core from its config: -0.1 per malformed-turn token, -0.05 per tool-error token;
                   SKIPPED tokens carry no loss and no advantage: `trained_mask`)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np


class TokenFlag(enum.IntEnum):
    NORMAL = 0
    MALFORMED = 1  # a turn whose tool call did not parse
    TOOL_ERROR = 2  # a turn whose tool call failed when run
    # A turn whose calls were never run, so its tokens had no effect: sampled after the episode
    # ended, after its agent was fired, or past the wall clock. No loss, no advantage.
    SKIPPED = 3


class Objective(enum.Enum):
    SUM = "sum"  # R_i = sum of every agent's reward events
    GKPO = "gkpo"  # R_i = u_beta(W_T / W_0), the wealth ratio through the power utility


@dataclasses.dataclass
class TrajectoryRow:
    tokens: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # bool [T]
    sampler_logp: np.ndarray  # float32 [T]
    routing: np.ndarray | None  # int16/int32 [T, n_moe_layers, k], or None for no MoE / no replay
    flags: np.ndarray  # int8 [T], TokenFlag values
    agent: str  # agent id within the rollout ("ceo", "a1", ...)
    role: str  # the agent's job title ("CEO", "Lead Engineer", ...)
    segment: int = 0  # context segment index (compaction boundaries)

    def __post_init__(self):
        t = len(self.tokens)
        for name in ("loss_mask", "sampler_logp", "flags"):
            if len(getattr(self, name)) != t:
                raise ValueError(f"TrajectoryRow.{name} has length {len(getattr(self, name))}, "
                                 f"tokens has {t} (agent {self.agent!r})")
        if self.routing is not None and len(self.routing) != t:
            raise ValueError(f"TrajectoryRow.routing has length {len(self.routing)}, tokens has "
                             f"{t} (agent {self.agent!r})")


def trained_mask(row: TrajectoryRow) -> np.ndarray:
    """bool [T]: the tokens a loss is taken on, the sampled ones that had an effect."""
    return np.asarray(row.loss_mask, bool) & (np.asarray(row.flags) != TokenFlag.SKIPPED)


@dataclasses.dataclass
class RewardEvent:
    agent: str  # who made the tool call the reward is attached to
    value: float
    seq: int  # event-log sequence number of that tool call
    label: str = ""  # e.g. "subtask_correct"


@dataclasses.dataclass
class Rollout:
    rows: list[TrajectoryRow]
    rewards: list[RewardEvent]
    budget: int  # the hire budget b sampled for this rollout (0 = single agent)
    hires: int  # specialists hired during the episode
    # Specialists that worked: the underhire penalty's "used budget" (rl/advantages.py). Hired
    # and then idle, or fired before doing anything, does not count (org/outcome.py says how).
    worked: int
    wealth_ratio: float | None = None  # W_T / W_0, for GKPO environments
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # latency, tokens, ...
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # titles, end reason, ...
    # The episode's event log (`avalon/org/events.py`), held by reference: the training
    # telemetry measures it with the same definitions the report reads from the logged files
    # (`avalon/analysis/metrics.py`). Empty for rollouts built by hand.
    events: Sequence[dict] = ()


@dataclasses.dataclass
class RolloutGroup:
    group_id: int  # explicit group index: advantages are normalised within it
    task_id: str
    rollouts: list[Rollout]
    objective: Objective = Objective.SUM
