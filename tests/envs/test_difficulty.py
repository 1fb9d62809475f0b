"""The curriculum that follows the model (avalon/envs/difficulty.py): deterministic draws, state
saved and restored, tasks at a group pass rate of 0 or 1 left out, tiers promoted and demoted,
and bad settings refused in one line naming the field."""

import dataclasses
import json

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.difficulty import DifficultyConfig, DifficultySampler, train_tiers
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.train.config import curriculum_section, from_config_dict
from configs import toy_org

# two environments: "a" with three tiers of 6 tasks, "b" with one tier of 4
TIERS = {"a": [[f"a{t}-{i}" for i in range(6)] for t in range(3)],
         "b": [[f"b-{i}" for i in range(4)]]}


def _sampler(seed=0, **fields):
    return DifficultySampler(TIERS, DifficultyConfig(**fields), seed=seed)


def _steps(s: DifficultySampler, steps: int, score) -> list:
    """Plays `steps` steps of 4 draws; each task's group of 2 results comes from score(env,
    task) (a number or a pair)."""
    drawn = []
    for _ in range(steps):
        pairs = s.sample(4)
        drawn.append(pairs)
        results = []
        for env, task in pairs:
            v = score(env, task)
            results += [(env, task, x) for x in (v if isinstance(v, tuple) else (v, v))]
        s.update(results)
    return drawn


def _half(env, task):
    return (0.0, 1.0)  # every group splits: nothing rests, nothing promotes (0.5 < 0.6)


def test_same_seed_same_draws_other_seed_other_draws():
    a, b, c = _sampler(7), _sampler(7), _sampler(8)
    assert _steps(a, 10, _half) == _steps(b, 10, _half)
    assert _steps(_sampler(7), 10, _half) != _steps(c, 10, _half)


def test_state_round_trip_continues_identically():
    s = _sampler(3, p_lower=0.3, p_higher=0.3, min_tasks=3, window=6)
    _steps(s, 5, lambda e, t: 1.0 if t.startswith("a0") else (0.0, 1.0))
    s.sample(2)  # mid-step: drawn but not yet measured (a refill is coming)
    state = json.loads(json.dumps(s.state()))  # JSON-ready
    t = _sampler(99, p_lower=0.3, p_higher=0.3, min_tasks=3, window=6)
    t.load_state(state)
    assert t.state() == s.state()
    assert t.tier_stats() == s.tier_stats() and t.metrics() == s.metrics()
    score = lambda e, task: (0.0, 1.0) if task.endswith("1") else 1.0  # noqa: E731
    assert _steps(t, 6, score) == _steps(s, 6, score)
    assert t.state() == s.state()


@pytest.mark.parametrize("bad, message", [
    ({"version": 2}, "expected a state dict of version 1"),
    ("levels", "'levels' must name every environment"),
    ("level_high", "environment 'b' has tiers 0..0, state says 1"),
    ("task", "state has task 'zz' of 'a', which is not in the sampler"),
    ("rate", "state of 'a0-0' must be [pass_rate, measured, rest_until, groups]"),
    ("step", "step must be an int >= 0, got -1"),
])
def test_load_state_refuses_a_state_of_another_sampler(bad, message):
    s = _sampler()
    _steps(s, 2, lambda e, t: 1.0)
    state = json.loads(json.dumps(s.state()))
    if bad == "levels":
        del state["levels"]["b"]
    elif bad == "level_high":
        state["levels"]["b"] = 1
    elif bad == "task":
        state["tasks"]["a"]["zz"] = [0.5, 0, 0, 1]
    elif bad == "rate":
        state["tasks"]["a"]["a0-0"] = [1.5, 0, 0, 1]
    elif bad == "step":
        state["step"] = -1
    else:
        state.update(bad)
    before = s.state()
    with pytest.raises(ValueError) as e:
        s.load_state(state)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert s.state() == before  # nothing half-loaded


def test_tasks_at_pass_rate_0_or_1_rest_for_skip_steps():
    s = _sampler(1, p_lower=0.0, p_higher=0.0, skip_steps=3, window=8, min_tasks=99)
    solved = {"a0-0", "a0-1"}  # always 1
    failed = {"a0-2"}  # always 0
    last_drawn = {}
    for step in range(30):
        pairs = [p for p in s.sample(2) if p[0] == "a"]  # never more than the 3 not resting
        for _, task in pairs:
            if task in solved | failed and task in last_drawn:
                assert step - last_drawn[task] > 3, (task, step, last_drawn[task])
            last_drawn[task] = step
        s.update([("a", t, 1.0 if t in solved else 0.0 if t in failed else x)
                  for _, t in pairs for x in (0.0, 1.0)])
    assert {"a0-0", "a0-1", "a0-2"} <= set(last_drawn)  # they do come back
    # without resting, a 6-task tier drawn 2 at a time would repeat tasks within 3 steps
    rests = _sampler(1, p_lower=0.0, p_higher=0.0, skip_steps=0)
    gaps = []
    seen = {}
    for step in range(30):
        for env, task in rests.sample(4):
            if env == "a" and task in seen:
                gaps.append(step - seen[task])
            seen[task] = step
        rests.update([])
    assert min(gaps) <= 3


def test_equal_results_rest_only_with_skip_uniform():
    for uniform, rests in ((True, 1), (False, 0)):
        s = _sampler(skip_uniform=uniform, skip_steps=2)
        s.update([("a", "a0-0", 0.5), ("a", "a0-0", 0.5), ("a", "a0-1", 0.0), ("a", "a0-1", 1.0)])
        stats = s.tier_stats()["a"][0]
        assert stats["resting"] == rests and stats["pass_rate"] == 0.5
    s = _sampler(skip_steps=2)
    s.update([("a", "a0-0", 0.5)])  # one result: its mean is no evidence of no variance
    assert s.tier_stats()["a"][0]["resting"] == 0


def test_a_step_draws_distinct_tasks_across_refills_while_it_can():
    s = _sampler(5, p_lower=0.0, p_higher=0.0)
    first = s.sample(3)
    refill = s.sample(3)
    drawn = [t for e, t in first + refill if e == "a"]
    assert len(drawn) == len(set(drawn))  # 6 tasks in tier 0: no repeat within the step
    many = s.sample(20)  # more than there are: repeats, but every task drawn first
    b = [t for e, t in many + first + refill if e == "b"]
    assert set(b) == set(TIERS["b"][0])


def test_promotion_needs_min_tasks_at_the_tier_and_starts_afresh():
    s = _sampler(2, p_lower=0.0, p_higher=0.0, min_tasks=4, window=5, promote_at=0.75,
                 skip_steps=0)
    ahead = [("a", "a1-0", 1.0), ("a", "a1-1", 1.0), ("a", "a1-2", 1.0)]  # looks ahead
    s.update([("a", "a0-0", 1.0), ("a", "a0-1", 1.0), ("a", "a0-2", 1.0)] + ahead)
    assert s.level("a") == 0  # three tasks measured: not yet
    s.update([("a", "a0-3", 0.5)])
    assert s.level("a") == 1 and s.moves["a"] == 1  # four, at (1 + 1 + 1 + 0.5) / 4 >= 0.75
    # the look ahead made before the promotion does not count at the new tier
    s.update([("a", "a1-3", 1.0)])
    assert s.level("a") == 1 and s.tier_stats()["a"][1]["tasks"] == 4
    s.update([("a", "a1-4", 1.0), ("a", "a1-5", 1.0), ("a", "a1-0", 1.0)])
    assert s.level("a") == 2
    s.update([("a", f"a2-{i}", 1.0) for i in range(6)])
    assert s.level("a") == 2 and s.level("b") == 0  # the top: nowhere further
    assert s.metrics()["curriculum/a/tier"] == 2.0 and s.metrics()["curriculum/a/moves"] == 2.0


def test_old_measurements_leave_the_window():
    s = _sampler(min_tasks=4, window=3, promote_at=0.75, skip_steps=0)
    s.update([("a", "a0-0", 1.0), ("a", "a0-1", 1.0), ("a", "a0-2", 1.0)])
    for _ in range(3):
        s.update([])
    s.update([("a", "a0-3", 1.0)])
    assert s.level("a") == 0  # the first three fell out of the 3-step window
    assert s.tier_stats()["a"][0]["tasks"] == 1


def test_demotion_below_demote_below():
    s = _sampler(start_tier=2, min_tasks=2, demote_below=0.2, promote_at=0.6, skip_steps=0)
    assert s.levels == {"a": 2, "b": 0}  # start_tier clipped to each environment's top
    s.update([("a", "a2-0", 0.0), ("a", "a2-1", 0.1)])
    assert s.level("a") == 1
    off = _sampler(start_tier=2, min_tasks=2, skip_steps=0)  # demote_below 0: never
    off.update([("a", "a2-0", 0.0), ("a", "a2-1", 0.0)])
    assert off.level("a") == 2


def test_look_back_and_ahead_frequencies():
    s = _sampler(11, p_lower=0.2, p_higher=0.3, start_tier=1, skip_steps=0)
    n = 4000
    tiers = [s.tier_of(e, t) for e, t in s.sample(n) if e == "a"]
    counts = np.bincount(tiers, minlength=3) / len(tiers)
    for got, want in zip(counts, (0.2, 0.5, 0.3)):  # one lower tier: all of p_lower is t0
        assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / len(tiers))
    bottom = _sampler(11, p_lower=0.2, p_higher=0.3, skip_steps=0)  # at t0 nothing is lower
    tiers = [bottom.tier_of(e, t) for e, t in bottom.sample(n) if e == "a"]
    counts = np.bincount(tiers, minlength=3) / len(tiers)
    assert counts[2] == 0 and abs(counts[1] - 0.3) < 4 * np.sqrt(0.21 / len(tiers))


def test_tier_stats_by_hand():
    s = _sampler(skip_steps=1)
    s.update([("a", "a0-0", 1.0), ("a", "a0-1", 0.25), ("a", "a0-1", 0.75), ("a", "a1-0", 0.0),
              ("b", "b-0", 0.5)])
    s.update([("a", "a0-1", 1.0)])  # the newest pass rate replaces the older
    stats = s.tier_stats()
    assert stats["a"][0] == {"tier": "t0", "current": True, "pass_rate": 1.0, "tasks": 2,
                             "groups": 3, "resting": 1}  # a0-1 rests until step 3, a0-0 left
    assert stats["a"][1]["pass_rate"] == 0.0 and stats["a"][2]["pass_rate"] is None
    assert stats["b"] == [{"tier": "t0", "current": True, "pass_rate": 0.5, "tasks": 1,
                           "groups": 1, "resting": 0}]
    m = s.metrics()
    assert m["curriculum/a/t0/pass_rate"] == 1.0 and "curriculum/a/t2/pass_rate" not in m


def test_bad_results_and_unknown_tasks():
    s = _sampler()
    for bad in (1.5, -0.1, True, "1"):
        with pytest.raises(ValueError, match="success of .* must be a number in \\[0, 1\\]"):
            s.update([("a", "a0-0", bad)])
    with pytest.raises(KeyError, match="has no task 'zz'"):
        s.update([("a", "zz", 1.0)])
    with pytest.raises(KeyError, match="has no environment 'c'"):
        s.update([("c", "a0-0", 1.0)])
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        s.sample(-1)
    assert s.step == 0
    with pytest.raises(ValueError, match="environment 'a' repeats task 'x'"):
        DifficultySampler({"a": [["x"], ["x"]]})
    with pytest.raises(ValueError, match="tier t1 has no tasks"):
        DifficultySampler({"a": [["x"], []]})


@pytest.mark.parametrize("field, value, why", [
    ("promote_at", 1.5, "must be in (0, 1]"),
    ("promote_at", 0.0, "must be in (0, 1]"),
    ("demote_below", 0.7, "must be in [0, promote_at=0.6)"),
    ("window", 0, "must be an integer >= 1"),
    ("min_tasks", 2.5, "must be an integer >= 1"),
    ("start_tier", -1, "must be an integer >= 0"),
    ("skip_steps", 8, "must be below window=8"),
    ("p_lower", 1.2, "must be in [0, 1]"),
    ("p_higher", float("nan"), "must be a number"),
    ("enabled", "yes", "must be a bool"),
])
def test_bad_settings_are_one_line_naming_the_field(field, value, why):
    with pytest.raises(ValueError) as e:
        DifficultyConfig(**{field: value})
    assert str(e.value) == f"DifficultyConfig.{field}={value!r}: {why}"
    with pytest.raises(ValueError, match=r"^DifficultyConfig.p_lower=0.6, p_higher=0.5: must add"):
        DifficultyConfig(p_lower=0.6, p_higher=0.5)


def test_config_section_default_off_and_checked():
    config = toy_org.get_config()
    cfg = from_config_dict(config, num_devices=1)
    assert cfg.curriculum == DifficultyConfig() and not cfg.curriculum.enabled
    del config.curriculum  # an optional section: a config without it gets the default
    assert from_config_dict(config, num_devices=1).curriculum == DifficultyConfig()
    config.curriculum = curriculum_section(enabled=True, promote_at=0.8)
    got = from_config_dict(config, num_devices=1).curriculum
    assert got == dataclasses.replace(DifficultyConfig(), enabled=True, promote_at=0.8)
    config.curriculum.promote_at = 1.5
    with pytest.raises(ValueError) as e:
        from_config_dict(config, num_devices=1)
    assert str(e.value) == ("config.curriculum: DifficultyConfig.promote_at=1.5: must be in "
                            "(0, 1]")
    config.curriculum = curriculum_section(window="8")
    with pytest.raises(ValueError, match=r"^config.curriculum.window='8': must be an int$"):
        from_config_dict(config, num_devices=1)
    with pytest.raises(ValueError, match="unknown field; DifficultyConfig has"):
        curriculum_section(promote=0.5)


def test_train_tiers_of_environments_with_and_without_tiers():
    par = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2),
                           tiers=({"n_subtasks": (1, 1), "n_train": 3},))
    prof = HiddenProfile(ProfileConfig(n_train=5, n_heldout=2))

    class Remote:  # an environment that knows nothing of tiers (as an ORS client)
        name = "remote"

        def task_ids(self, split):
            return ("r-train-0", "r-train-1") if split is Split.TRAIN else ("r-heldout-0",)

    tiers = train_tiers([par, prof, Remote()])
    assert tiers == {"parallel": [tuple(f"parallel-t0-train-{i}" for i in range(3)),
                                  tuple(f"parallel-train-{i}" for i in range(4))],
                     "hidden_profile": [prof.task_ids(Split.TRAIN)],
                     "remote": [("r-train-0", "r-train-1")]}
    s = DifficultySampler(tiers, DifficultyConfig(p_lower=0.0, p_higher=0.0))
    assert all(par.tier_of(t) == 0 for e, t in s.sample(30) if e == "parallel")
