"""The training loop draws its tasks from the difficulty sampler when the curriculum is on: the
steps' tasks come from the tier the sampler holds, and its measurements are logged."""

from __future__ import annotations

import json
import os

import pytest

from tests.train.runner import metrics, run_main

CURRICULUM = ("--config.env.tiers=True", "--config.curriculum.enabled=True",
              "--config.curriculum.min_tasks=1", "--config.curriculum.promote_at=1.0",
              "--config.curriculum.p_lower=0.0", "--config.curriculum.p_higher=0.0",
              "--config.sft.steps=0", "--config.rollout.steps=2")


@pytest.mark.ci  # a two-step run of the micro config (~1.5 min of CPU)
def test_curriculum_draws_from_the_start_tier_and_logs_it(tmp_path):
    workdir = str(tmp_path / "run")
    run_main(workdir, *CURRICULUM)
    rl = [r for r in metrics(workdir) if r.get("phase") == "rl"]
    assert len(rl) == 2
    for r in rl:
        # No look ahead or back and a tier the untrained model cannot pass wholly: every
        # group of both steps was drawn from t0, the easier tier.
        assert r["curriculum/parallel/tier"] == 0.0
        assert "curriculum/parallel/t1/pass_rate" not in r
    measured = [r["curriculum/parallel/t0/tasks"] for r in rl]
    assert measured[0] == 2.0 and measured[1] >= 2.0  # two groups a step, distinct tasks
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["curriculum"]["enabled"] is True
