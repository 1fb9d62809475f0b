"""Organisation metrics: the co-ordination behaviours, and evaluation's metric names."""

import pytest

from avalon.rl.types import RewardEvent, Rollout, RolloutGroup
from avalon.train.evaluation import arm_metrics
from avalon.train.org_metrics import rollout_metrics


def _rollout(reward, **metrics):
    return Rollout(rows=[], rewards=[RewardEvent("ceo", reward, 0, "x")], budget=3, hires=1,
                   worked=1, metrics={"agents": 2.0, **metrics})


def test_review_share_and_result_handoffs():
    groups = [RolloutGroup(0, "verification-heldout-0", [
        _rollout(1.0, **{"env/reviews": 2.0}), _rollout(0.0, **{"env/reviews": 0.0}),
        _rollout(2.0, **{"env/reviews": 1.0}), _rollout(1.0, **{"env/reviews": 0.0})]),
        RolloutGroup(1, "parallel-heldout-0", [
            _rollout(3.0, **{"env/handoffs": 2.0}), _rollout(1.0, **{"env/handoffs": 0.0})])]
    m = rollout_metrics(groups)
    assert m["org/review_share"] == 0.5  # 2 of the 4 rollouts that can review did
    assert m["org/result_handoffs"] == 1.0
    assert m["reward/mean"] == pytest.approx(8 / 6)
    assert "org/review_share" not in rollout_metrics(groups[1:])


def test_eval_metric_names():
    groups = [RolloutGroup(0, "t", [_rollout(1.0, **{"env/reviews": 1.0}), _rollout(3.0)])]
    m = arm_metrics(groups, "org")
    assert m["eval/org_reward"] == 2.0 and m["eval/org/reward/mean"] == 2.0
    assert m["eval/org/hires_per_rollout"] == 1.0 and m["eval/org/review_share"] == 1.0
    assert not any(k.startswith("eval/org/org/") or k.startswith("eval/org_org") for k in m)
    assert "eval/single_reward" in arm_metrics(groups, "single")
