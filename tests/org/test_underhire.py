"""Underhire without a loophole: the penalty's "used budget" counts specialists that worked,
so hiring and at once firing, or hiring an agent that only waits, does not cancel it."""

import dataclasses

import numpy as np
import pytest

from avalon.envs.samplers import BudgetConfig, BudgetSampler, BudgetScope
from avalon.org import OrgConfig, PromptStyle
from avalon.rl.advantages import rollout_reward
from avalon.rl.config import RLConfig
from avalon.rl.types import Objective
from tests.org.helpers import call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

CFG = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
RL = RLConfig(underhire_slope=0.5)
HIRE = call("hire", title="S", role="s", tools=["work"])
LONG = "y" * 400  # 8 s of model time: the CEO's fire lands first


def _rollout(steps, budget=2):
    result, _, events = run_playbook(PartsEnv(), steps, budget=budget, config=CFG)
    return result.groups[0].rollouts[0], events


def _penalty(rollout):
    no_reward = dataclasses.replace(rollout, rewards=[])
    return -rollout_reward(no_reward, Objective.SUM, RL)


def test_hire_then_fire_keeps_the_penalty():
    steps = {"ceo": [step(HIRE, HIRE), step(call("fire", agent="a1"), call("fire", agent="a2")),
                     step(call("final_message", text="done"))],
             "a1": [step(call("work", part="a"), text=LONG)],
             "a2": [step(call("dm", to="ceo", text="hi"), text=LONG)]}
    r, events = _rollout(steps)
    assert r.hires == 2 and r.worked == 0
    assert len(events_of(events, "model_call", skipped="fired")) == 2
    assert _penalty(r) == pytest.approx(0.5 * 2)  # the whole budget is unused


def test_idle_hires_keep_the_penalty_and_working_ones_lift_it():
    steps = {"ceo": [step(HIRE, HIRE), step(call("wait_for_messages"))],
             "a1": [step(call("roster")), step(call("wait_for_messages"))],
             "a2": [step(call("work", part="a")), step(call("dm", to="ceo", text="done"))]}
    r, _ = _rollout(steps, budget=3)
    assert r.hires == 2 and r.worked == 1 and r.metrics["worked"] == 1.0
    assert _penalty(r) == pytest.approx(0.5 * 2)  # budget 3, one worked
    # A failed call is not work either.
    steps["a2"] = [step(call("work", part="zz"))]
    r, _ = _rollout(steps, budget=3)
    assert r.worked == 0 and _penalty(r) == pytest.approx(0.5 * 3)


def test_worked_is_checked():
    r, _ = _rollout({"ceo": [step(call("final_message", text="done"))]}, budget=0)
    with pytest.raises(ValueError, match="Rollout.worked=1 must be in 0..hires"):
        rollout_reward(dataclasses.replace(r, worked=1), Objective.SUM, RL)


def test_budget_per_rollout_or_per_group():
    k = 4
    per_rollout = BudgetSampler(BudgetConfig(p_single=0.2, max_budget=8), seed=3)
    per_group = BudgetSampler(BudgetConfig(p_single=0.2, max_budget=8,
                                           scope=BudgetScope.GROUP), seed=3)
    a = np.array(per_rollout.sample_groups(200, k)).reshape(200, k)
    b = np.array(per_group.sample_groups(200, k)).reshape(200, k)
    assert (b == b[:, :1]).all()  # one budget per group
    assert (a != a[:, :1]).any(axis=1).mean() > 0.5  # most groups mix budgets
    assert b[:, 0].tolist() == BudgetSampler(per_group.config, seed=3).sample(200)
    assert 0.1 < (b[:, 0] == 0).mean() < 0.3  # p_single still holds per group
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        per_group.sample_groups(2, 0)
