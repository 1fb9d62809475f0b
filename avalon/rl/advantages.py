"""Collective rewards and group-relative advantages (SPEC §3), host-side numpy.

For rollout i of a group (K rollouts of one task, grouped by the explicit `group_id`):

    R_i = Σ over every agent's reward events            (Objective.SUM)
        = u_β(W_T / W_0)                                 (Objective.GKPO)
    R_i ← R_i − underhire_slope · max(budget_i − worked_i, 0)
    A_i = (R_i − mean_j R_j) / std_j R_j                 (population std, ddof = 0)

worked_i counts the specialists that worked (`Rollout.worked`), not those hired: hiring and at
once firing, or hiring an agent that only idles, leaves the penalty where it was, so the cheap
way out of it is closed and the way that remains is to put the hires to work.

A group carries no learning signal when its rollouts' collective rewards (before any shaping)
all agree: with `group_filter = raw` (the default) a group whose *raw* reward std is
≤ `zero_std_tol` is dropped, whatever its penalties, so the underhire penalty (drawn with each
rollout's budget) cannot give an all-fail group advantages; `shaped` decides on R_i with the
penalty instead (the earlier reading). A kept group whose penalised std is ≤ `zero_std_tol` is
dropped too, and every group of one rollout is, so no epsilon is ever added to the std.
A_i then goes on every loss token of every agent row of rollout i (any number of rows: agents
hired mid-episode, compaction segments), and per-token shaping is added after normalisation:
`malformed_penalty` on each token of a malformed tool turn, `tool_error_penalty` on each token of
a tool-error turn (`TrajectoryRow.flags`). Tokens outside the loss mask, and those of skipped
turns (TokenFlag.SKIPPED: they had no effect), carry 0.

A dropped group loses its shaping too (nothing of it is trained on); our reading of "dropped".
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from avalon.rl.config import GroupFilter, RLConfig
from avalon.rl.types import (
    Objective,
    Rollout,
    RolloutGroup,
    TokenFlag,
    TrajectoryRow,
    trained_mask,
)


def gkpo_utility(wealth_ratio, beta):
    """GKPO's power utility u_β(x) = (x^β − 1) / β of the wealth ratio x = W_T / W_0.

    Computed as expm1(β · log x) / β, which is exact near β = 0, where it tends to Kelly's
    log x (β = 0 exactly returns log x; no division by zero). β = 1 gives x − 1 (risk-neutral).
    For β > 0 it is bounded below by −1/β and finite at x = 0 (ruin). A negative ratio (more
    than everything lost) is treated as ruin, x = 0. Works on arrays; returns a JAX array.
    """
    x = jnp.maximum(jnp.asarray(wealth_ratio, jnp.float32), 0.0)
    beta = jnp.asarray(beta, jnp.float32)
    log_x = jnp.log(x)  # -inf at ruin; expm1(-inf) = -1 keeps u finite for beta > 0
    kelly = beta == 0
    safe_beta = jnp.where(kelly, 1.0, beta)
    return jnp.where(kelly, log_x, jnp.expm1(safe_beta * log_x) / safe_beta)


def rollout_reward(rollout: Rollout, objective: Objective, cfg: RLConfig) -> float:
    """R_i of one rollout, underhire penalty included (before group normalisation)."""
    return raw_reward(rollout, objective, cfg) - underhire_penalty(rollout, cfg)


def raw_reward(rollout: Rollout, objective: Objective, cfg: RLConfig) -> float:
    """The collective reward of one rollout before any shaping (`group_filter = raw` keeps a
    group on its spread)."""
    if objective == Objective.SUM:
        values = [e.value for e in rollout.rewards]
        bad = [e for e in rollout.rewards if not math.isfinite(e.value)]
        if bad:
            raise ValueError(f"RewardEvent.value={bad[0].value!r} (agent {bad[0].agent!r}, seq "
                             f"{bad[0].seq}) is not finite")
        r = float(np.sum(values, dtype=np.float64))
    elif objective == Objective.GKPO:
        x = rollout.wealth_ratio
        if x is None or not math.isfinite(x):
            raise ValueError(f"Rollout.wealth_ratio={x!r}: a GKPO rollout needs a finite W_T/W_0")
        r = float(gkpo_utility(x, cfg.beta))
    else:
        raise ValueError(f"objective={objective!r}: must be an Objective")
    return r


def underhire_penalty(rollout: Rollout, cfg: RLConfig) -> float:
    """slope x the hire budget no specialist worked for (>= 0; subtracted from R_i)."""
    if not 0 <= rollout.worked <= rollout.hires:
        raise ValueError(f"Rollout.worked={rollout.worked!r} must be in 0..hires "
                         f"({rollout.hires})")
    unused = max(rollout.budget - rollout.worked, 0)
    return cfg.underhire_slope * unused


@dataclasses.dataclass(frozen=True)
class ScoredGroup:
    """One group after scoring. `advantages` is None when the group was dropped."""

    group_id: int
    task_id: str
    rollouts: list[Rollout]
    rewards: np.ndarray  # float64 [K], penalty included
    std: float  # population std (ddof = 0) of `rewards`
    advantages: np.ndarray | None  # float64 [K]
    raw: np.ndarray | None = None  # float64 [K]: the collective rewards before shaping


@dataclasses.dataclass(frozen=True)
class AdvantageStats:
    groups: int
    kept_groups: int
    dropped_groups: int  # zero variance (std <= zero_std_tol), groups of one included
    rollouts: int  # in kept groups
    reward_mean: float  # over all rollouts, kept or not (penalty included)
    raw_reward_mean: float  # the same before shaping (the collective reward itself)
    # dropped because every rollout's raw reward was the same: all zero (nothing scored) or
    # all equal and positive
    dropped_all_zero: int
    dropped_all_equal: int
    adv_mean: float  # over kept rollouts (NaN when none)
    adv_std: float
    adv_min: float
    adv_max: float


def merge_groups(groups: list[RolloutGroup]) -> list[RolloutGroup]:
    """Group rollouts by the explicit `group_id` (never by position): pieces with the same id
    are concatenated, in first-seen order; their task and objective must agree."""
    merged: dict[int, RolloutGroup] = {}
    for g in groups:
        if g.group_id not in merged:
            merged[g.group_id] = RolloutGroup(g.group_id, g.task_id, list(g.rollouts),
                                              g.objective)
            continue
        m = merged[g.group_id]
        if (m.task_id, m.objective) != (g.task_id, g.objective):
            raise ValueError(f"RolloutGroup.group_id={g.group_id} is used for task {m.task_id!r} "
                             f"({m.objective}) and task {g.task_id!r} ({g.objective})")
        m.rollouts.extend(g.rollouts)
    return list(merged.values())


def score_groups(groups: list[RolloutGroup], cfg: RLConfig) -> tuple[list[ScoredGroup],
                                                                      AdvantageStats]:
    """Rewards and advantages per group (merged by `group_id`); groups without signal dropped
    (`group_filter`, see the module docstring)."""
    scored, all_rewards, all_raw, kept_adv = [], [], [], []
    all_zero = all_equal = 0
    for g in merge_groups(groups):
        raw = np.array([raw_reward(ro, g.objective, cfg) for ro in g.rollouts], np.float64)
        r = raw - np.array([underhire_penalty(ro, cfg) for ro in g.rollouts], np.float64)
        all_rewards.append(r)
        all_raw.append(raw)
        std = float(r.std()) if len(r) else 0.0  # ddof = 0
        raw_std = float(raw.std()) if len(raw) else 0.0
        signal = std > cfg.zero_std_tol and (cfg.group_filter == GroupFilter.SHAPED
                                             or raw_std > cfg.zero_std_tol)
        adv = None
        if signal:
            adv = (r - r.mean()) / std
            kept_adv.append(adv)
        elif raw_std <= cfg.zero_std_tol and len(raw):
            if np.all(raw == 0):
                all_zero += 1
            else:
                all_equal += 1
        scored.append(ScoredGroup(g.group_id, g.task_id, g.rollouts, r, std, adv, raw))
    kept = np.concatenate(kept_adv) if kept_adv else np.zeros(0)
    rewards = np.concatenate(all_rewards) if all_rewards else np.zeros(0)
    raws = np.concatenate(all_raw) if all_raw else np.zeros(0)
    nan = float("nan")
    stats = AdvantageStats(
        groups=len(scored), kept_groups=len(kept_adv), dropped_groups=len(scored) - len(kept_adv),
        rollouts=len(kept), reward_mean=float(rewards.mean()) if len(rewards) else nan,
        raw_reward_mean=float(raws.mean()) if len(raws) else nan,
        dropped_all_zero=all_zero, dropped_all_equal=all_equal,
        adv_mean=float(kept.mean()) if len(kept) else nan,
        adv_std=float(kept.std()) if len(kept) else nan,
        adv_min=float(kept.min()) if len(kept) else nan,
        adv_max=float(kept.max()) if len(kept) else nan)
    return scored, stats


def has_signal(group: RolloutGroup, cfg: RLConfig) -> bool:
    """Whether `group` would be kept by `score_groups` (the refill's test while rollouts of
    other groups still run)."""
    [scored], _ = score_groups([group], cfg)
    return scored.advantages is not None


def token_advantages(row: TrajectoryRow, advantage: float, cfg: RLConfig) -> np.ndarray:
    """float32 [T]: A_i plus the shaping of each token's own turn on loss tokens, 0 elsewhere."""
    flags = np.asarray(row.flags)
    known = np.isin(flags, [int(f) for f in TokenFlag])
    if not known.all():
        raise ValueError(f"TrajectoryRow.flags has unknown value {int(flags[~known][0])} "
                         f"(agent {row.agent!r}, segment {row.segment}); use TokenFlag values")
    shaping = np.where(flags == TokenFlag.MALFORMED, cfg.malformed_penalty,
                       np.where(flags == TokenFlag.TOOL_ERROR, cfg.tool_error_penalty, 0.0))
    adv = np.where(trained_mask(row), advantage + shaping, 0.0)
    return adv.astype(np.float32)
