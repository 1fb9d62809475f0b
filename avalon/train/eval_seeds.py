"""The held-out evaluation's tasks and rollout seeds, defined once.

Tasks: an environment's first `eval.tasks` held-out tasks of tier `eval.tier` (-1, the default:
its top tier, today's tasks; a tier past an environment's top is its top), so a run that trains
on an easier tier is evaluated on that tier's held-out tasks, and on today's by a second
evaluation of the same checkpoints with `eval.tier=-1` (transfer).

Per held-out task (its index among an environment's first `eval.tasks`), arm (0: the
organisation, 1: the single agent) and seed index (`eval.seeds`), a rollout samples with
`EVAL_SEED + (task x 2 + arm) x 1000 + seed`: the same seeds at every evaluation, so evaluations
at different steps differ only by the policy. The baselines replay them (`baselines.py`): the
clock sweeps with the same seeds at other clocks, `eval.s8` with the single arm's seed of each
organisation rollout.
"""

from __future__ import annotations

from avalon.envs.base import Split
from avalon.envs.tiers import tier_task_ids

EVAL_SEED = 10_000_000  # eval seeds never collide with training rollout seeds
ARMS = 2  # organisation, single agent
SEEDS_PER_ARM = 1000  # room for eval.seeds


def rollout_seed(task_index: int, arm_index: int, seed_index: int, base: int = EVAL_SEED) -> int:
    return base + (task_index * ARMS + arm_index) * SEEDS_PER_ARM + seed_index


# The single agent's seed is the organisation rollout's plus this (same task, same seed index).
SINGLE_ARM_OFFSET = rollout_seed(0, 1, 0, base=0)


def heldout_task_ids(env, eval_cfg) -> tuple[str, ...]:
    """The held-out tasks an evaluation plays in `env` (see the module docstring)."""
    tiers = tier_task_ids(env, Split.HELDOUT)
    tier = len(tiers) - 1 if eval_cfg.tier < 0 else min(eval_cfg.tier, len(tiers) - 1)
    return tuple(tiers[tier][:eval_cfg.tasks])
