"""experiments/bench/review_quality.py on a small run played by the scripted teacher, whose
verifier reports what the environment's `review` tool told it (the truth): its verdicts are
checked against the builds' true defects, and the numbers are the report's."""

from __future__ import annotations

import math

from avalon.analysis.report import analyse
from experiments.bench.review_quality import MEASURES, markdown, review_quality
from tests.experiments.small_run import evaluate


def test_review_quality_of_a_truthful_verifier_and_the_report_agree(tmp_path):
    evaluate(tmp_path, 600, 0, verifier_rate=0.0)  # no verifier: nobody reviews
    evaluate(tmp_path, 610, 10, verifier_rate=1.0)  # a verifier in every team
    out = review_quality(str(tmp_path))
    assert out["first_step"] == 600
    at = {(r["step"], r["arm"], r["measure"]): r for r in out["rows"]}
    assert {k[:2] for k in at} == {(600, "org"), (600, "single"), (610, "org"), (610, "single")}

    # No verifier: no review at all, so review quality is n/a (nothing to count), while the
    # team's shipped defects are counted.
    assert at[(600, "org", "teams_with_review")]["estimate"]["estimate"] == 0.0
    for name in ("review_message_precision", "review_message_recall", "rubber_stamp_share"):
        assert at[(600, "org", name)]["estimate"] is None, name
    assert at[(600, "org", "shipped_defects_per_rollout")]["estimate"] is not None

    # A verifier in every team that tells the truth: every team reviews, every reject verdict
    # is of a defective build and every defective build it judged was rejected; no approval
    # of a defective build.
    last = {n: at[(610, "org", n)]["estimate"] for n in MEASURES}
    assert last["teams_with_review"]["estimate"] == 1.0
    assert last["verdicts_per_team"]["estimate"] > 0
    for name in ("review_message_precision", "review_message_recall"):  # 29 of 29 here
        e = last[name]
        assert e["estimate"] == 1.0 and e["count"] == e["of"] > 0, name
    assert last["rubber_stamp_share"]["estimate"] == 0.0
    assert last["rubber_stamps_per_team"]["estimate"] == 0.0
    # ... and the CEO ships only what was reviewed sound: no shipped defect, where the teams
    # without a verifier shipped some.
    assert last["shipped_defect_share"]["estimate"] == 0.0
    assert at[(600, "org", "shipped_defect_share")]["estimate"]["estimate"] > 0.0
    # Reviewing is what the verifier adds: the paired change in teams with a review is +1.
    s = at[(610, "org", "teams_with_review")]["shift"]
    assert (s["first"], s["last"], s["diff"]) == (0.0, 1.0, 1.0)
    assert at[(600, "org", "teams_with_review")]["shift"] is None  # the first evaluation

    # The single agent has no team: volume and review quality n/a; it ships blind.
    for name in ("teams_with_review", "reviews_per_team", "review_message_precision",
                 "rubber_stamps_per_team"):
        assert at[(610, "single", name)]["estimate"] is None, name
    assert at[(610, "single", "shipped_defects_per_rollout")]["estimate"] is not None

    # The same numbers as the report's checkpoints (one definition of each measure).
    report, _ = analyse(str(tmp_path))
    for c in report["checkpoints"]:
        for name in MEASURES:
            mine, theirs = at[(c["step"], c["arm"], name)]["estimate"], c[name]
            assert (mine is None) == (theirs is None), (c["step"], c["arm"], name)
            if mine is not None:
                assert math.isclose(mine["estimate"], theirs["estimate"]), name
                assert math.isclose(mine["se"], theirs["se"]), name
    table = markdown(out)
    assert "| 10 | org |" in table and "Paired change" in table
