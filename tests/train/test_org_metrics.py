"""The training loop's organisation metrics are the report's measures (`avalon/analysis/
metrics.py`) on the same logs, and evaluation's metric names."""

import math

import numpy as np
import pytest

from avalon.analysis import metrics
from avalon.analysis.judges import RuleJudge
from avalon.rl.types import RewardEvent, Rollout, RolloutGroup
from avalon.train.evaluation import arm_metrics
from avalon.train.org_metrics import rollout_metrics
from tests.analysis.builders import (
    parallel_team,
    single_agent,
    team_with_lead,
    team_without_lead,
    verification_single,
    verification_team,
)

LOGS = (team_with_lead, single_agent, team_without_lead, verification_team, verification_single,
        parallel_team)


def _rollout(logged) -> Rollout:
    """A rollout as the organisation hands it on, carrying its event log."""
    events = logged.events
    hires = sum(e["kind"] == "hire" for e in events)
    return Rollout(rows=[], rewards=[RewardEvent("ceo", logged.reward, 0, "x")],
                   budget=int(events[0]["budget"]), hires=hires, worked=hires, events=events)


def test_the_loop_logs_the_reports_numbers():
    logged = [f() for f in LOGS]
    groups = [RolloutGroup(0, "t", [_rollout(r) for r in logged[:3]]),
              RolloutGroup(1, "v", [_rollout(r) for r in logged[3:]])]
    loop = rollout_metrics(groups)
    labels = metrics.judge_rollouts([r.events for r in logged], RuleJudge())
    report = metrics.aggregate([metrics.rollout_metrics(r.events, lab)
                                for r, lab in zip(logged, labels)])
    for m in metrics.MEASURES:
        key = "reward/mean" if m.name == "reward" else f"org/{m.name}"
        if report[m.name] is None:
            assert key not in loop, m.name
        else:
            assert loop[key] == report[m.name]["estimate"], m.name
    # By hand: rewards 2, 1.5, 1, -1, -2, 1; hires 3, 0, 2, 2, 0, 1.
    assert loop["reward/mean"] == pytest.approx(2.5 / 6)
    assert loop["reward/std"] == pytest.approx(np.std([2, 1.5, 1, -1, -2, 1]))
    assert loop["org/hires_per_rollout"] == pytest.approx(8 / 6)
    # Teams A, C, D, F; the rule judge finds review messages in A ("LGTM", "reviewed a") and
    # D; only D's environment records reviews (2: a2 reviewed a1's builds).
    assert loop["org/teams_with_review_message"] == pytest.approx(2 / 4)
    assert loop["org/teams_with_review"] == 1.0 and loop["org/reviews_per_team"] == 2.0
    assert loop["org/review_message_precision"] == 0.5 and loop["org/result_messages"] == 1.0
    assert loop["org/end_final_message"] == pytest.approx(2 / 6)
    assert loop["org/titles"]["Builder"] == 1 and len(loop["org/titles"]) == 8
    for old in metrics.ALIASES:  # old names are gone from the loop's metrics
        assert f"org/{old}" not in loop


def test_single_agents_log_no_team_measure():
    groups = [RolloutGroup(0, "t", [_rollout(single_agent()), _rollout(verification_single())])]
    m = rollout_metrics(groups)
    assert "org/teams_with_review" not in m and "org/coordination_time_share" not in m
    assert m["org/shipped_defects_per_rollout"] == 1.0
    assert math.isclose(m["org/messages_per_agent"], 0.0)


def test_a_rollout_without_its_log_is_an_error():
    r = Rollout(rows=[], rewards=[], budget=0, hires=0, worked=0)
    with pytest.raises(ValueError, match="without its event log"):
        rollout_metrics([RolloutGroup(0, "t", [r])])


def test_eval_metric_names():
    groups = [RolloutGroup(0, "t", [_rollout(verification_team()), _rollout(single_agent())])]
    m = arm_metrics(groups, "org")
    assert m["eval/org_reward"] == 0.25 and m["eval/org/reward/mean"] == 0.25
    assert m["eval/org/hires_per_rollout"] == 1.0 and m["eval/org/teams_with_review"] == 1.0
    assert not any(k.startswith("eval/org/org/") or k.startswith("eval/org_org") for k in m)
    assert "eval/single_reward" in arm_metrics(groups, "single")
