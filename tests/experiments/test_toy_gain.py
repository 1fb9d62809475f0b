"""experiments/bench/toy_gain.py on hand-built evaluation logs (numbers worked out by hand), and
its numbers are the report's measures."""

from __future__ import annotations

import math
import statistics

import pytest

from experiments.bench.toy_gain import compare
from tests.analysis.builders import (
    parallel_team,
    single_agent,
    team_with_lead,
    team_without_lead,
    verification_team,
    with_task,
    write_eval_step,
)


def _write(workdir, step, env, rollouts):
    """rollouts: [(arm, seed_index, events)], at RL step step // 10."""
    write_eval_step(workdir, step, step // 10, env, rollouts)


def test_paired_rise_and_org_vs_single(tmp_path):
    w = str(tmp_path)
    single = [("single", 0, with_task(single_agent(), t)) for t in ("t1", "t2")]  # 1.5 each
    # Organisation: t1 team_with_lead (reward 2, 3 hires, reviews) -> verification_team (-1,
    # 2 hires, reviews); t2 team_without_lead (1, 2 hires, none) -> team_with_lead (2, 3).
    _write(w, 10, "toy", [("org", 0, with_task(team_with_lead(), "t1")),
                          ("org", 0, with_task(team_without_lead(), "t2")), *single])
    _write(w, 40, "toy", [("org", 0, with_task(verification_team(), "t1")),
                          ("org", 0, with_task(team_with_lead(), "t2")), *single])
    out = compare(w)
    assert (out["first_step"], out["last_step"]) == (10, 40)
    r = out["rise"]["org/all/reward"]  # differences -3 and +1
    assert (r["n"], r["first"], r["last"], r["diff"]) == (2, 1.5, 0.5, -1.0)
    assert r["se"] == pytest.approx(statistics.stdev([-3, 1]) / math.sqrt(2))
    assert r["z"] == pytest.approx(-0.5)
    assert out["rise"]["org/toy/reward"] == r  # one environment
    h = out["rise"]["org/all/hires_per_rollout"]
    assert (h["first"], h["last"], h["diff"]) == (2.5, 2.5, 0.0)
    # The rule judge: team_with_lead's "LGTM" and "reviewed a" are reviews; the verification
    # team's five; team_without_lead has none.
    t = out["rise"]["org/all/teams_with_review_message"]
    assert (t["first"], t["last"]) == (0.5, 1.0)
    assert "org/all/review_message_precision" not in out["rise"]  # no ground truth at step 10
    assert "single/all/teams_with_review_message" not in out["rise"]  # n/a: no team
    assert out["rise"]["single/all/reward"]["diff"] == 0.0
    ovs = out["org_vs_single"]["last"]  # pairs t1: -1 vs 1.5, t2: 2 vs 1.5
    assert (ovs["n"], ovs["diff"]) == (2, -1.0)
    assert ovs["se"] == pytest.approx(statistics.stdev([-2.5, 0.5]) / math.sqrt(2))


def test_result_messages_count_only_the_senders_own_results(tmp_path):
    w = str(tmp_path)
    for step in (0, 5):
        _write(w, step, "parallel", [("org", 0, parallel_team().events)])
    q = compare(w)["rise"]["org/parallel/result_messages"]
    assert q["first"] == 1.0 and q["n"] == 1  # "s1 7" carries a1's 7; "s3 8" does not


def test_one_evaluation_is_an_error(tmp_path):
    _write(str(tmp_path), 0, "parallel", [("org", 0, parallel_team().events)])
    with pytest.raises(SystemExit, match="needs 2"):
        compare(str(tmp_path))
