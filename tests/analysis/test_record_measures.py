"""The report's review and verification measures against the environment's own end records:
on a hand-built run (numbers by hand), on the toy smoke run (slow) and, given its directory,
on any run (`AVALON_RECORD_RUN=RUN`, slow: the README toy run in RESULTS.md). And the learning
paragraph of an organisation whose every review call failed never calls it reviewing."""

from __future__ import annotations

import json
import os

import pytest

from avalon import analyze
from avalon.analysis.report import analyse
from tests.analysis.builders import (
    verification_failing_team,
    verification_single,
    verification_team,
    with_task,
    write_eval_step,
)
from tests.analysis.records import disagreements


def _write(run, step, rl_step, logs):
    write_eval_step(run, step, rl_step, "verification", [(arm, 0, ev) for arm, ev in logs])


def _run(tmp_path, first, last):
    """Two evaluations of tasks v1 and v2: the organisation's rollouts `first` then `last`,
    the single agent's verification_single both times."""
    run = tmp_path / "run"
    single = [("single", with_task(verification_single(), t)) for t in ("v1", "v2")]
    _write(run, 600, 0, [("org", with_task(first[0](), "v1")), ("org", with_task(first[1](), "v2")),
                         *single])
    _write(run, 700, 20, [("org", with_task(last[0](), "v1")), ("org", with_task(last[1](), "v2")),
                          *single])
    return run


def test_review_measures_are_the_end_records_by_hand(tmp_path):
    """At RL step 0 both teams fail every review and ship (0 reviews, 0 ships recorded); at
    20 one team reviews twice (a defect found) and ships 2 (one defective), the other still
    fails."""
    run = _run(tmp_path, (verification_failing_team, verification_failing_team),
               (verification_team, verification_failing_team))
    report, _ = analyse(str(run))
    assert disagreements(report) == []
    at = {(c["step"], c["arm"]): c for c in report["checkpoints"]}
    first, last = at[(600, "org")], at[(700, "org")]
    assert first["teams_with_review"]["estimate"] == 0.0 and first["teams_with_review"]["of"] == 2
    assert first["reviews_per_team"]["estimate"] == 0.0
    assert first["shipped_per_rollout"]["estimate"] == 0.0
    assert first["shipped_defect_share"] is None and first["reviewed_ship_share"] is None
    # ... while their messages read as reviews: "p1 defect ok" in both teams.
    assert first["teams_with_review_message"]["estimate"] == 1.0
    assert first["review_messages_per_team"]["estimate"] == 1.0
    assert (last["teams_with_review"]["count"], last["teams_with_review"]["of"]) == (1, 2)
    assert last["reviews_per_team"]["estimate"] == (2 + 0) / 2
    assert last["defects_found_per_team"]["estimate"] == (1 + 0) / 2
    assert last["self_review_share"]["estimate"] == 0.0
    assert last["shipped_per_rollout"]["estimate"] == (2 + 0) / 2
    assert last["shipped_defects_per_rollout"]["estimate"] == (1 + 0) / 2
    assert last["shipped_defect_share"]["estimate"] == 1 / 2
    assert (last["reviewed_ship_share"]["count"], last["reviewed_ship_share"]["of"]) == (1, 2)
    single = at[(700, "single")]
    assert single["teams_with_review"] is None and single["shipped_per_rollout"]["estimate"] == 1
    # The failed calls: the review and the ship of each failing team, per role and tool.
    rows = {(r["step"], r["arm"], r["role"], r["tool"]): r for r in report["failed_calls"]}
    ship = rows[(600, "org", "ceo", "ship")]
    assert (ship["calls"], ship["failed"], ship["share"]) == (2, 2, 1.0)
    assert ship["error"] == "p# is closed after # wrong codes" and ship["error_count"] == 2
    review = rows[(600, "org", "specialist", "review")]
    assert (review["calls"], review["failed"]) == (2, 2)
    assert review["error"] == "p# has no result '#'"
    assert rows[(600, "org", "specialist", "build")]["failed"] == 0
    assert first["failed_calls_per_rollout"]["estimate"] == 2.0
    assert first["failed_calls_ceo"]["estimate"] == 1.0
    assert first["failed_calls_per_specialist"]["estimate"] == 2 / 4


def test_a_report_checked_against_records_it_contradicts_says_so(tmp_path):
    """The check can fail: a report whose record sum is altered disagrees."""
    run = _run(tmp_path, (verification_failing_team, verification_failing_team),
               (verification_team, verification_failing_team))
    report, _ = analyse(str(run))
    rec = next(r for r in report["env_records"] if r["step"] == 700 and r["arm"] == "org")
    rec["fields"]["reviews"]["team_sum"] += 1
    assert disagreements(report) == ["('eval', 700, 'org') reviews_per_team: report 1.0, "
                                     "end records 1.5"]


def test_the_paragraph_never_calls_a_team_that_never_reviewed_reviewing(tmp_path):
    run = _run(tmp_path, (verification_failing_team, verification_failing_team),
               (verification_failing_team, verification_failing_team))
    report, _ = analyse(str(run))
    text = report["learning"]
    assert ("Reviews the environment ran (its end record): teams with a review 0.0% -> 0.0% "
            "(no change); reviews per team 0.00 -> 0.00 (no change)") in text
    assert ("No review succeeded at RL step 0 or 20 (the environment recorded 0 reviews in "
            "every team): there the organisation does not review.") in text
    assert ("Messages that read as reviews (at RL step 20 words only, no review ran behind "
            "them; labelled by the rule judge): teams with a review message 100% -> 100%") \
        in text
    # Where a team did review, the paragraph says how many.
    text = analyse(str(_run(tmp_path / "b", (verification_failing_team,) * 2,
                            (verification_team, verification_failing_team))))[0]["learning"]
    assert "teams with a review 0.0% -> 50% (+1.0 SE)" in text and "No review" not in text


@pytest.mark.slow
@pytest.mark.ci
def test_the_smoke_runs_report_agrees_with_its_end_records(toy_smoke_run):
    analyze.main([str(toy_smoke_run)])
    with open(toy_smoke_run / "report" / "report.json") as f:
        report = json.load(f)
    assert report["env_records"]  # collective verification keeps end records
    assert disagreements(report) == []


@pytest.mark.slow
def test_a_given_runs_report_agrees_with_its_end_records():
    """`AVALON_RECORD_RUN=RUN python -m pytest -m slow -k given_runs`: RUN's report (written
    by `python -m avalon.analyze RUN`) against its end records."""
    run = os.environ.get("AVALON_RECORD_RUN")
    if not run:
        pytest.skip("AVALON_RECORD_RUN is not set")
    with open(os.path.join(run, "report", "report.json")) as f:
        report = json.load(f)
    assert report["env_records"] and disagreements(report) == []
