"""Curricula and samplers: the clock schedule's formula, learning-progress weights, the budget
mix, and state saved and restored with a checkpoint."""

import json

import numpy as np
import pytest

from avalon.envs.curriculum import ClockSchedule
from avalon.envs.samplers import (
    BudgetConfig,
    BudgetSampler,
    LearningProgressSampler,
    ProgressConfig,
)

TASKS = {"alpha": ["a0", "a1", "a2", "a3"], "beta": ["b0", "b1", "b2", "b3"]}


def test_clock_schedule_formula():
    real = ClockSchedule.real()
    assert real(0) == 7200.0 and real(200) == pytest.approx(5.1 * 3600)
    assert real(100) == pytest.approx(7200 + (18360 - 7200) / 2)
    assert real(57) == pytest.approx(7200 + (18360 - 7200) * 57 / 200)
    assert real(1000) == real(200)  # constant after the ramp
    toy = ClockSchedule.toy(ramp_steps=50)
    assert toy(0) == pytest.approx(300.0) and toy(50) == pytest.approx(765.0)
    assert toy(50) / toy(0) == pytest.approx(real(200) / real(0))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="step must be an int >= 0"):
            real(bad)
    with pytest.raises(ValueError, match="end_s"):
        ClockSchedule(100.0, 50.0, 10)
    with pytest.raises(ValueError, match="ramp_steps"):
        ClockSchedule(100.0, 200.0, 0)
    assert ClockSchedule(**real.state()) == real


def test_learning_progress_formula():
    cfg = ProgressConfig(fast_rate=0.5, slow_rate=0.1, floor=0.01, unvisited_weight=0.05)
    s = LearningProgressSampler({"e": ["x", "y", "z"]}, cfg, seed=0)
    s.update([("e", "x", 0.0)])
    s.update([("e", "x", 1.0), ("e", "y", 0.4)])
    s.update([("e", "x", 1.0), ("e", "y", 0.4)])
    fast = 0.0 + 0.5 * (1 - 0.0)
    fast += 0.5 * (1 - fast)
    slow = 0.0 + 0.1 * (1 - 0.0)
    slow += 0.1 * (1 - slow)
    w = np.array([abs(fast - slow), 0.01, 0.05])  # x changing, y constant, z unvisited
    p = s.task_probabilities("e")
    assert [p[k] for k in "xyz"] == pytest.approx((w / w.sum()).tolist())


def test_weights_move_toward_tasks_whose_success_changes():
    s = LearningProgressSampler(TASKS, seed=0)
    for step in range(30):
        results = [("alpha", "a0", min(1.0, step / 15)),  # learning
                   ("alpha", "a1", 1.0), ("alpha", "a2", 0.0),  # solved / hopeless
                   ("alpha", "a3", 0.5)]  # stuck halfway
        results += [("beta", b, 0.5) for b in TASKS["beta"]]  # nothing moves in beta
        s.update(results)
    p = s.task_probabilities("alpha")
    assert p["a0"] > 0.7 and all(p["a0"] > 10 * p[k] for k in ("a1", "a2", "a3"))
    pe = s.env_probabilities()
    assert pe["alpha"] > 0.75  # the environment whose mean success moves
    draws = s.sample(4000)
    share = np.mean([t == ("alpha", "a0") for t in draws])
    assert share == pytest.approx(pe["alpha"] * p["a0"], abs=0.03)
    # The floor keeps every task in play.
    assert min(p.values()) > 0 and min(s.task_probabilities("beta").values()) > 0


def test_sample_draws_distinct_tasks_per_environment():
    s = LearningProgressSampler(TASKS, seed=3)
    draws = s.sample(6)
    for env in TASKS:
        picked = [t for e, t in draws if e == env]
        if len(picked) <= 4:
            assert len(set(picked)) == len(picked)
    assert len(s.sample(40)) == 40  # more than there are tasks: with replacement
    with pytest.raises(ValueError, match="success"):
        s.update([("alpha", "a0", 1.5)])
    with pytest.raises(KeyError, match="no task 'zz'"):
        s.update([("alpha", "zz", 0.5)])


def test_learning_progress_state_round_trip():
    a = LearningProgressSampler(TASKS, seed=5)
    for step in range(5):
        a.update([("alpha", "a0", step / 5), ("beta", "b1", 1.0)])
        a.sample(3)
    state = json.loads(json.dumps(a.state()))  # what the checkpoint stores
    b = LearningProgressSampler(TASKS, seed=999)
    b.load_state(state)
    assert b.task_probabilities("alpha") == a.task_probabilities("alpha")
    assert b.env_probabilities() == a.env_probabilities()
    assert b.sample(20) == a.sample(20)  # the same draws follow
    with pytest.raises(ValueError, match="not in the sampler"):
        LearningProgressSampler({"alpha": ["a0"], "beta": ["b0"]}).load_state(state)
    with pytest.raises(ValueError, match="version"):
        b.load_state({"version": 0})


def test_budget_mix_matches_its_configuration():
    n = 40000
    b = BudgetSampler(seed=0).sample(n)
    counts = np.bincount(b, minlength=9) / n
    assert counts[0] == pytest.approx(0.2, abs=4 * np.sqrt(0.2 * 0.8 / n))
    sd = np.sqrt(0.1 * 0.9 / n)
    assert np.all(np.abs(counts[1:] - 0.1) < 4 * sd) and max(b) == 8
    custom = BudgetSampler(BudgetConfig(p_single=0.5, max_budget=3), seed=1).sample(n)
    c = np.bincount(custom, minlength=4) / n
    assert c == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6], abs=0.012) and max(custom) == 3
    assert BudgetConfig().probabilities() == pytest.approx([0.2] + [0.1] * 8)
    with pytest.raises(ValueError, match="p_single"):
        BudgetConfig(p_single=1.5)


def test_budget_state_round_trip():
    a = BudgetSampler(seed=2)
    a.sample(7)
    b = BudgetSampler(seed=3)
    b.load_state(json.loads(json.dumps(a.state())))
    assert a.sample(50) == b.sample(50)


def test_progress_is_change_between_steps_not_noise_within_a_group():
    # Task "noisy": every step a group of 8 with half successes (mean 0.5, no change); task
    # "moving": its group mean climbs 0.1 a step. One update per task per step.
    cfg = ProgressConfig(fast_rate=0.5, slow_rate=0.1, floor=0.01, unvisited_weight=0.05)
    s = LearningProgressSampler({"e": ["noisy", "moving"]}, cfg, seed=0)
    for step in range(5):
        group = [("e", "noisy", float(i % 2)) for i in range(8)]
        s.update(group + [("e", "moving", 0.1 * step)] * 8)
    assert s.tasks["e"].stats["noisy"] == [0.5, 0.5, 5]  # five steps, five updates, no change
    p = s.task_probabilities("e")
    fast = slow = 0.0
    for step in range(1, 5):
        fast += 0.5 * (0.1 * step - fast)
        slow += 0.1 * (0.1 * step - slow)
    w = np.array([0.01, abs(fast - slow)])
    assert [p["noisy"], p["moving"]] == pytest.approx((w / w.sum()).tolist())
    assert p["moving"] > 0.8
    # The environment level: the mean of its tasks' means, once per step.
    assert s.envs.stats["e"][2] == 5
