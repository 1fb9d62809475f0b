"""Organisation telemetry from finished rollouts: the measures of `avalon/analysis/metrics.py`.

Each rollout is measured from its event log (`Rollout.events`) and labelled by the rule judge,
exactly as the run report measures the logged files with its default judge, so the training
loop's `org/<measure>` (and evaluation's `eval/<arm>/<measure>`) is the report's number on the
same rollouts. A measure that is n/a for these rollouts (a team measure over single agents) is
left out. Besides the measures: `reward/mean` (the `reward` measure) and `reward/std` (its std
over rollouts), `org/end_<reason>` (share of rollouts ending so) and `org/titles` (the eight
most common job titles). Names match the plots in `avalon/train/plots.py`.

With several processes each measures its own rollouts and the processes add each measure's
numerators and denominators before dividing (`rollout_sums`, `host_metrics.Pooled`), so the
logged number is the measure over every process's rollouts, as the report computes it over
all of the run's event logs at once.
"""

from __future__ import annotations

import numpy as np

from avalon.analysis import metrics
from avalon.analysis.judges import RuleJudge
from avalon.rl.types import Rollout, RolloutGroup
from avalon.train.host_metrics import Pooled, Shares, finish

_JUDGE = RuleJudge()


def collective_reward(rollout: Rollout) -> float:
    """R_i as the environment scored it: the sum of every agent's reward events (no shaping)."""
    return float(sum(ev.value for ev in rollout.rewards))


def success(rollout: Rollout) -> float:
    """The learning-progress sampler's score: the environment's `success` metric when it
    reports one, else whether the collective reward is positive."""
    value = rollout.metrics.get("env/success")
    return float(value) if value is not None else float(collective_reward(rollout) > 0)


def measured(rollouts: list[Rollout]) -> list[metrics.RolloutMetrics]:
    """Each rollout's counts (`metrics.rollout_metrics`) under the rule judge's labels."""
    for r in rollouts:
        if not r.events:
            raise ValueError("org_metrics: a rollout without its event log (Rollout.events); "
                             "the organisation's build_rollout attaches it")
    logs = [r.events for r in rollouts]
    labels = metrics.judge_rollouts(logs, _JUDGE)
    return [metrics.rollout_metrics(ev, lab) for ev, lab in zip(logs, labels)]


def rollout_sums(groups: list[RolloutGroup], prefix: str = "") -> dict:
    """Every measure over every rollout of `groups` as its sums (`host_metrics.Pooled`: the
    measure's numerators and denominators, `metrics.sums`) and the end reasons as counts of
    the rollouts (`host_metrics.Shares`): what a process adds to the others' before the
    division, so a multi-process run logs each measure over the union of its rollouts, the
    report's number. `host_metrics.finish` (or `reduce_across_hosts`) makes the values."""
    rollouts = [r for g in groups for r in g.rollouts]
    if not rollouts:
        return {}
    ms = measured(rollouts)
    out = {f"{prefix}reward/mean": Pooled(*metrics.sums(metrics.BY_NAME["reward"], ms)),
           f"{prefix}reward/std": float(np.std([m.reward for m in ms]))}
    for m in metrics.MEASURES:
        if m.name != "reward":
            # n/a here (no denominator) is 0 of 0: another process may hold the denominator.
            out[f"{prefix}org/{m.name}"] = Pooled(*metrics.sums(m, ms))
    out[f"{prefix}org/end_"] = Shares(metrics.end_reason_counts(ms), len(ms))
    titles = metrics.top_titles(ms)
    if titles:
        out[f"{prefix}org/titles"] = titles
    return out


def rollout_metrics(groups: list[RolloutGroup], prefix: str = "") -> dict:
    """Every measure over every rollout of `groups` (see the module docstring): the values of
    `rollout_sums`, as one process logs them."""
    return finish(rollout_sums(groups, prefix))


def per_task_success(groups: list[RolloutGroup], env_of: dict[str, str]
                     ) -> list[tuple[str, str, float]]:
    """(environment, task, success) for every rollout: the learning-progress sampler's input."""
    return [(env_of[g.task_id], g.task_id, success(r)) for g in groups for r in g.rollouts]
