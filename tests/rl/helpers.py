"""Synthetic rollout data for the RL core's tests."""

from __future__ import annotations

import numpy as np

from avalon.rl.types import RewardEvent, Rollout, RolloutGroup, TokenFlag, TrajectoryRow
from tests.analysis.builders import minimal_events


def make_row(rng: np.random.Generator, length: int, *, agent: str = "ceo", vocab: int = 128,
             routing_shape: tuple[int, int] | None = None, n_experts: int = 8,
             loss_frac: float = 0.5, fill_token: int | None = None) -> TrajectoryRow:
    """A row of `length` tokens; the first token is a prompt token, the rest sampled with
    probability `loss_frac`. `fill_token` makes every token that value (to identify rows)."""
    tokens = (np.full(length, fill_token, np.int32) if fill_token is not None
              else rng.integers(0, vocab, length).astype(np.int32))
    mask = rng.random(length) < loss_frac
    mask[0] = False
    logp = np.where(mask, -rng.random(length) * 4, 0.0).astype(np.float32)
    routing = None
    if routing_shape is not None:
        m, k = routing_shape
        routing = np.stack([rng.choice(n_experts, k, replace=False)
                            for _ in range(length * m)]).reshape(length, m, k).astype(np.int32)
    return TrajectoryRow(tokens=tokens, loss_mask=mask, sampler_logp=logp, routing=routing,
                         flags=np.full(length, TokenFlag.NORMAL, np.int8), agent=agent,
                         role=agent.upper())


def make_rollout(rows: list[TrajectoryRow], rewards: list[float], *, budget: int = 0,
                 hires: int = 0, wealth_ratio: float | None = None,
                 worked: int | None = None) -> Rollout:
    """Reward events spread over the rollout's agents (round robin)."""
    events = [RewardEvent(agent=rows[i % len(rows)].agent, value=v, seq=i)
              for i, v in enumerate(rewards)]
    return Rollout(rows=rows, rewards=events, budget=budget, hires=hires,
                   worked=hires if worked is None else worked,
                   wealth_ratio=wealth_ratio,
                   events=minimal_events(rewards, budget=budget, hires=hires))


def make_group(group_id: int, rollouts: list[Rollout], **kw) -> RolloutGroup:
    return RolloutGroup(group_id=group_id, task_id=f"task{group_id}", rollouts=rollouts, **kw)
