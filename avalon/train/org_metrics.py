"""Organisation telemetry from finished rollouts: rewards, hiring, titles, co-ordination, clock.

Everything here is a pure function of `RolloutGroup`s, so the same numbers come out of training
steps and evaluations. Names (the `org/` prefix) match the plots in `avalon/train/plots.py`.
"""

from __future__ import annotations

import collections

import numpy as np

from avalon.rl.types import Rollout, RolloutGroup

_PER_AGENT = ("messages", "trace_reads")


def collective_reward(rollout: Rollout) -> float:
    """R_i as the environment scored it: the sum of every agent's reward events (no shaping)."""
    return float(sum(ev.value for ev in rollout.rewards))


def success(rollout: Rollout) -> float:
    """The learning-progress sampler's score: the environment's `success` metric when it
    reports one, else whether the collective reward is positive."""
    value = rollout.metrics.get("env/success")
    return float(value) if value is not None else float(collective_reward(rollout) > 0)


def _mean(xs) -> float:
    xs = list(xs)
    return float(np.mean(xs)) if xs else 0.0


def rollout_metrics(groups: list[RolloutGroup], prefix: str = "") -> dict:
    """Means over every rollout of `groups` (see the module docstring)."""
    rollouts = [r for g in groups for r in g.rollouts]
    if not rollouts:
        return {}
    out = {
        f"{prefix}reward/mean": _mean(collective_reward(r) for r in rollouts),
        f"{prefix}reward/std": float(np.std([collective_reward(r) for r in rollouts])),
        f"{prefix}org/hires_per_rollout": _mean(r.hires for r in rollouts),
        f"{prefix}org/budget_use": _mean(r.hires / r.budget for r in rollouts if r.budget > 0),
        f"{prefix}org/single_agent_share": _mean(r.budget == 0 for r in rollouts),
        f"{prefix}org/latency_s": _mean(r.metrics.get("latency_s", 0.0) for r in rollouts),
        f"{prefix}org/critical_token_share": _mean(r.metrics.get("critical_token_share", 0.0)
                                                   for r in rollouts),
        f"{prefix}org/tokens_per_rollout": _mean(r.metrics.get("tokens", 0.0) for r in rollouts),
        f"{prefix}org/coordination_share": _mean(r.metrics.get("coordination_share", 0.0)
                                                 for r in rollouts),
        f"{prefix}org/malformed_turns": _mean(r.metrics.get("malformed_turns", 0.0)
                                              for r in rollouts),
        f"{prefix}org/tool_error_turns": _mean(r.metrics.get("tool_error_turns", 0.0)
                                               for r in rollouts),
        f"{prefix}org/compactions": _mean(r.metrics.get("compactions", 0.0) for r in rollouts),
    }
    agents = sum(r.metrics.get("agents", 1.0) for r in rollouts)
    for name in _PER_AGENT:
        total = sum(r.metrics.get(name, 0.0) for r in rollouts)
        out[f"{prefix}org/{name}_per_agent"] = float(total / max(agents, 1.0))
    ceo = sum(r.metrics.get("tokens_out_ceo", 0.0) for r in rollouts)
    spec = sum(r.metrics.get("tokens_out_specialists", 0.0) for r in rollouts)
    out[f"{prefix}org/tokens_out_ceo"] = ceo / len(rollouts)
    out[f"{prefix}org/tokens_out_specialists"] = spec / len(rollouts)
    ends = collections.Counter(k.split("/", 1)[1] for r in rollouts for k in r.metrics
                               if k.startswith("end/"))
    for reason, n in ends.items():
        out[f"{prefix}org/end_{reason}"] = n / len(rollouts)
    # Behaviours the co-ordination environments need, over the rollouts that report them:
    # teams with at least one review by another agent (verification; the report's 42% -> 64%),
    # and results passed between agents that a dependant needed (parallel subtasks).
    reviewed = [r.metrics["env/reviews"] > 0 for r in rollouts if "env/reviews" in r.metrics]
    if reviewed:
        out[f"{prefix}org/review_share"] = _mean(reviewed)
    handoffs = [r.metrics["env/handoffs"] for r in rollouts if "env/handoffs" in r.metrics]
    if handoffs:
        out[f"{prefix}org/result_handoffs"] = _mean(handoffs)
    titles = collections.Counter(t for r in rollouts for t in r.info.get("titles", ()))
    if titles:
        out[f"{prefix}org/titles"] = dict(titles.most_common(8))
        lead = sum(n for t, n in titles.items() if "lead" in t.lower())
        out[f"{prefix}org/lead_title_share"] = lead / sum(titles.values())
    return out


def per_task_success(groups: list[RolloutGroup], env_of: dict[str, str]
                     ) -> list[tuple[str, str, float]]:
    """(environment, task, success) for every rollout: the learning-progress sampler's input."""
    return [(env_of[g.task_id], g.task_id, success(r)) for g in groups for r in g.rollouts]
