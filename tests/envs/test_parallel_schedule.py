"""The exact schedule search of the parallel-subtasks environment, against brute force."""

import itertools

import numpy as np
import pytest

from avalon.envs.parallel import best_headcount, horizon_units, max_solved, plan


def brute_force(costs, deps, workers, horizon):
    """Most subtasks finished by `horizon`: every choice of start time (or none) per subtask,
    feasible when dependencies finish first and at most `workers` run at any moment."""
    n = len(costs)
    best = 0
    options = [[None] + list(range(0, horizon - c + 1)) for c in costs]
    for starts in itertools.product(*options):
        ok = all(s is None or all(starts[d] is not None and starts[d] + costs[d] <= s
                                  for d in deps[j]) for j, s in enumerate(starts))
        if not ok:
            continue
        busy = [sum(1 for j in range(n) if starts[j] is not None
                    and starts[j] <= t < starts[j] + costs[j]) for t in range(horizon)]
        if max(busy, default=0) <= workers:
            best = max(best, sum(s is not None for s in starts))
    return best


def random_instance(rng, n):
    costs = [int(c) for c in rng.integers(1, 4, size=n)]
    deps = [[int(rng.integers(j))] if j and rng.random() < 0.4 else [] for j in range(n)]
    return costs, deps


def test_plan_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(25):
        n = int(rng.integers(2, 6))
        costs, deps = random_instance(rng, n)
        for workers in (1, 2, 3):
            horizon = int(rng.integers(2, 6))
            assert max_solved(costs, deps, workers, horizon) == brute_force(
                costs, deps, workers, horizon), (costs, deps, workers, horizon)


def test_plan_is_a_valid_schedule():
    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(3, 8))
        costs, deps = random_instance(rng, n)
        workers, horizon = int(rng.integers(1, 5)), int(rng.integers(2, 8))
        p = plan(costs, deps, workers, horizon)
        assert len(p.starts) == p.solved
        finish = {j: s + costs[j] for j, _, s in p.starts}
        for j, w, s in p.starts:
            assert 0 <= w < workers and finish[j] <= horizon
            assert all(d in finish and finish[d] <= s for d in deps[j])
        for w in range(p.workers):  # one subtask at a time per worker
            spans = sorted((s, s + costs[j]) for j, ww, s in p.starts if ww == w)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_waiting_can_be_optimal():
    # One worker, horizon 3: a (2 units) then its dependant b (1) beats starting c (3) first.
    assert max_solved([2, 1, 3], [[], [0], []], 1, 3) == 2
    # Two workers, a chain of 3 units and four 1-unit tasks in a horizon of 3: 6 of 6 fit.
    assert max_solved([1, 1, 1, 1, 1, 1], [[], [0], [1], [], [], []], 2, 3) == 6


def test_best_headcount():
    costs, deps = [2, 2, 2, 2], [[], [], [], []]
    assert [max_solved(costs, deps, h + 1, 2) for h in range(5)] == [1, 2, 3, 4, 4]
    assert best_headcount(costs, deps, 2, 8) == 3
    assert best_headcount(costs, deps, 2, 1) == 1  # the budget caps it
    # A chain gains nothing from a team.
    assert best_headcount([1, 1, 1], [[], [0], [1]], 3, 8) == 0
    assert horizon_units(300, 60, 30) == 4 and horizon_units(20, 60, 30) == 0


@pytest.mark.parametrize("bad, match", [
    (([0], [[]], 1, 2), "costs"), (([1, 1], [[1], [0]], 1, 2), "cycle"),
    (([1], [[0]], 1, 2), "another subtask"), (([1], [[]], 0, 2), "workers"),
    (([1], [[]], 1, -1), "horizon"), (([1, 2], [[]], 1, 2), "dependency lists")])
def test_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        plan(*bad)


def test_silent_plan_keeps_each_tree_on_one_worker():
    from avalon.envs.parallel.schedule import components, silent_plan
    # A star: s0 (1 unit) whose result s1..s3 (1 unit each) need, and a lone s4 (2 units).
    costs, deps = [1, 1, 1, 1, 2], [[], [0], [0], [0], []]
    assert components(deps) == [[0, 1, 2, 3], [4]]
    # Passing s0's result on, 4 workers finish all 5 in 2 units; without it the star stays on
    # one worker (2 of 4 fit in 2 units) and the lone task on another.
    assert max_solved(costs, deps, 4, 2) == 5
    solved, lists = silent_plan(costs, deps, 4, 2)
    assert solved == 3 and lists == [[0, 1], [4], [], []]
    rng = np.random.default_rng(0)
    for _ in range(30):  # never above the optimum; every tree on one worker
        n = int(rng.integers(1, 7))
        costs = [int(c) for c in rng.integers(1, 4, size=n)]
        deps = [[int(rng.integers(j))] if j and rng.random() < 0.6 else [] for j in range(n)]
        w, h = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        solved, lists = silent_plan(costs, deps, w, h)
        assert solved <= max_solved(costs, deps, w, h)
        owner = {j: i for i, lst in enumerate(lists) for j in lst}
        assert all(owner.get(d, owner[j]) == owner[j] for j in owner for d in deps[j])
