"""Which held-out tasks an evaluation plays: `eval.tier` picks the tier, -1 today's tasks."""

from __future__ import annotations

import types

import pytest

from avalon.envs.base import Split
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.train.eval_seeds import heldout_task_ids

TOP = ParallelConfig(n_subtasks=(2, 3), dep_prob=0.0, clock_s=240.0, n_train=16, n_heldout=6,
                     seed=0)


def _eval(tasks, tier=-1):
    return types.SimpleNamespace(tasks=tasks, tier=tier)


def test_the_default_is_todays_held_out_tasks_with_or_without_tiers():
    plain = ParallelSubtasks(TOP)
    tiered = ParallelSubtasks(TOP, tiers=({"n_subtasks": (1, 1), "n_train": 8,
                                           "n_heldout": 4},))
    today = plain.task_ids(Split.HELDOUT)[:5]
    assert heldout_task_ids(plain, _eval(5)) == tuple(today)
    assert heldout_task_ids(tiered, _eval(5)) == tuple(today)
    assert heldout_task_ids(plain, _eval(5, tier=0)) == tuple(today)  # one tier: its top


@pytest.mark.parametrize("tier", [0, 1, 7])
def test_a_tier_gives_that_tiers_held_out_tasks(tier):
    env = ParallelSubtasks(TOP, tiers=({"n_subtasks": (1, 1), "n_train": 8, "n_heldout": 4},))
    ids = heldout_task_ids(env, _eval(3, tier=tier))
    expected = env.tier_task_ids(Split.HELDOUT, min(tier, env.n_tiers - 1))[:3]
    assert ids == tuple(expected) and len(ids) == 3
    assert {env.tier_of(t) for t in ids} == {min(tier, env.n_tiers - 1)}
