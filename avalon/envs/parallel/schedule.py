"""Exact schedules for parallel subtasks: how many can k workers finish before the clock?

The model (integer time units): subtask j takes `costs[j]` units on one worker, cannot start
before every subtask in `deps[j]` has finished, and runs without interruption. k identical
workers all start at time 0. A subtask counts when it finishes by the horizon T. `plan` returns
a schedule with the most subtasks finished; `best_headcount` the fewest hires (workers = hires +
1, the CEO works too) that reach the most for a budget.

The search. Some optimal schedule is semi-active (every start is 0 or a finish time, since a
start is the later of the worker's previous finish and the dependencies' finishes), so decisions
happen only at 0 and at finish times. At each decision time the search tries every set of
startable subtasks that fits the free workers (including none: waiting can be optimal with
dependencies) and jumps to the next finish. A subtask is startable when its dependencies are done
and it can still finish by T. States are memoised; a branch that reaches the upper bound (done +
running + every subtask that could still fit) stops the search early. Exhaustive, so meant for
the handful of subtasks these tasks have (at most `MAX_JOBS`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

MAX_JOBS = 12


@dataclasses.dataclass(frozen=True)
class Plan:
    """An optimal schedule: `starts` holds (job, worker, start) sorted by start, then worker."""

    solved: int  # subtasks finished by the horizon
    starts: tuple[tuple[int, int, int], ...]
    workers: int

    def jobs_of(self, worker: int) -> list[int]:
        """The jobs of one worker, in start order."""
        return [j for j, w, _ in self.starts if w == worker]

    def finish_of(self, worker: int, costs: Sequence[int]) -> int:
        """When the worker's last job finishes (0 with no jobs)."""
        return max((s + costs[j] for j, w, s in self.starts if w == worker), default=0)


def horizon_units(clock_s: float, unit_s: float, overhead_s: float) -> int:
    """Whole work units that fit in `clock_s` after `overhead_s` (planning and token time)."""
    if not unit_s > 0 or overhead_s < 0:
        raise ValueError(f"horizon_units: unit_s must be > 0 and overhead_s >= 0, got {unit_s} "
                         f"and {overhead_s}")
    return max(0, math.floor((clock_s - overhead_s) / unit_s + 1e-9))


def _check(costs: Sequence[int], deps: Sequence[Sequence[int]], workers: int,
           horizon: int) -> None:
    n = len(costs)
    if not 1 <= n <= MAX_JOBS:
        raise ValueError(f"schedule: 1..{MAX_JOBS} subtasks, got {n}")
    if len(deps) != n:
        raise ValueError(f"schedule: {n} costs but {len(deps)} dependency lists")
    for j, c in enumerate(costs):
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"schedule: costs[{j}] must be an int >= 1, got {c!r}")
    for j, ds in enumerate(deps):
        for d in ds:
            if not (isinstance(d, int) and 0 <= d < n and d != j):
                raise ValueError(f"schedule: deps[{j}] has {d!r}, not another subtask index")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"schedule: workers must be an int >= 1, got {workers!r}")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"schedule: horizon must be an int >= 0, got {horizon!r}")
    # Kahn's algorithm: a cycle leaves some subtask never ready.
    left = {j: set(ds) for j, ds in enumerate(deps)}
    while left:
        ready = [j for j, ds in left.items() if not ds]
        if not ready:
            raise ValueError(f"schedule: dependencies form a cycle among {sorted(left)}")
        for j in ready:
            del left[j]
        for ds in left.values():
            ds.difference_update(ready)


def plan(costs: Sequence[int], deps: Sequence[Sequence[int]], workers: int,
         horizon: int) -> Plan:
    """A schedule finishing the most subtasks by `horizon` on `workers` workers."""
    _check(costs, deps, workers, horizon)
    n = len(costs)
    costs = tuple(costs)
    need = tuple(sum(1 << d for d in ds) for ds in deps)
    k = min(workers, n)  # more workers than subtasks never help

    @functools.cache
    def best(t: int, done: int, running: tuple[tuple[int, int], ...]) -> tuple[int, tuple]:
        busy = sum(1 << j for _, j in running)
        avail = [j for j in range(n) if not (done | busy) >> j & 1
                 and need[j] & ~done == 0 and t + costs[j] <= horizon]
        waiting = [j for j in range(n) if not (done | busy) >> j & 1
                   and t + costs[j] <= horizon]
        upper = done.bit_count() + len(running) + len(waiting)
        top, choice = -1, ()
        free = k - len(running)
        for r in range(min(free, len(avail)), -1, -1):
            for started in itertools.combinations(avail, r):
                queue = sorted(running + tuple((t + costs[j], j) for j in started))
                if not queue:
                    value = done.bit_count()
                else:
                    t2 = queue[0][0]
                    finished = sum(1 << j for f, j in queue if f == t2)
                    value = best(t2, done | finished, tuple(q for q in queue if q[0] != t2))[0]
                if value > top:
                    top, choice = value, started
                if top == upper:
                    return top, choice
        return top, choice

    # Replay the choices, giving each started job a free worker (the one that ran one of its
    # dependencies when possible, so chains stay on one worker), else the lowest free index.
    starts: list[tuple[int, int, int]] = []
    free_at = [0] * k
    last: list[int | None] = [None] * k
    t, done, running = 0, 0, ()
    solved = best(0, 0, ())[0]
    while True:
        _, started = best(t, done, running)
        for j in started:
            idle = [w for w in range(k) if free_at[w] <= t]
            owner = [w for w in idle if last[w] is not None and last[w] in deps[j]]
            w = owner[0] if owner else idle[0]
            starts.append((j, w, t))
            free_at[w], last[w] = t + costs[j], j
        queue = sorted(running + tuple((t + costs[j], j) for j in started))
        if not queue:
            break
        t = queue[0][0]
        done |= sum(1 << j for f, j in queue if f == t)
        running = tuple(q for q in queue if q[0] != t)
    starts.sort(key=lambda x: (x[2], x[1]))
    return Plan(solved=solved, starts=tuple(starts), workers=k)


def max_solved(costs: Sequence[int], deps: Sequence[Sequence[int]], workers: int,
               horizon: int) -> int:
    """The most subtasks `workers` workers can finish by `horizon`."""
    return plan(costs, deps, workers, horizon).solved


def best_headcount(costs: Sequence[int], deps: Sequence[Sequence[int]], horizon: int,
                   max_budget: int) -> int:
    """The fewest hires h in 0..max_budget whose h + 1 workers finish the most subtasks."""
    if isinstance(max_budget, bool) or not isinstance(max_budget, int) or max_budget < 0:
        raise ValueError(f"best_headcount: max_budget must be an int >= 0, got {max_budget!r}")
    scores = [max_solved(costs, deps, h + 1, horizon) for h in range(max_budget + 1)]
    return scores.index(max(scores))


def components(deps: Sequence[Sequence[int]]) -> list[list[int]]:
    """The dependency trees (connected components), each as sorted job indices, in order of
    their smallest job."""
    parent = list(range(len(deps)))

    def root(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    for j, ds in enumerate(deps):
        for d in ds:
            parent[root(j)] = root(d)
    groups: dict[int, list[int]] = {}
    for j in range(len(deps)):
        groups.setdefault(root(j), []).append(j)
    return sorted(groups.values())


def silent_plan(costs: Sequence[int], deps: Sequence[Sequence[int]], workers: int,
                horizon: int) -> tuple[int, list[list[int]]]:
    """A schedule in which no result crosses workers: every dependency tree stays on one
    worker. Trees go, longest total work first, to the least-loaded worker (ties: the lowest
    index); each worker's share is ordered (and cut to what fits) by the exact one-worker
    schedule. Returns (subtasks finished by the horizon, each worker's jobs in order). A
    heuristic (trees are not split to balance load), so a lower bound on the best silent
    schedule."""
    _check(costs, deps, workers, horizon)
    trees = sorted(components(deps), key=lambda t: (-sum(costs[j] for j in t), t[0]))
    shares: list[list[int]] = [[] for _ in range(workers)]
    load = [0] * workers
    for tree in trees:
        w = min(range(workers), key=lambda i: (load[i], i))
        shares[w] += tree
        load[w] += sum(costs[j] for j in tree)
    solved, lists = 0, []
    for share in shares:
        if not share:
            lists.append([])
            continue
        share = sorted(share)
        local = {j: i for i, j in enumerate(share)}
        p = plan([costs[j] for j in share], [[local[d] for d in deps[j]] for j in share], 1,
                 horizon)
        solved += p.solved
        lists.append([share[i] for i in p.jobs_of(0)])
    return solved, lists


def best_silent_headcount(costs: Sequence[int], deps: Sequence[Sequence[int]], horizon: int,
                          max_budget: int) -> int:
    """The fewest hires whose silent plan (`silent_plan`) finishes the most subtasks."""
    scores = [silent_plan(costs, deps, h + 1, horizon)[0] for h in range(max_budget + 1)]
    return scores.index(max(scores))
