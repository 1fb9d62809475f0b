"""The training loop, the report and the benchmarks give one number per measure on a small
run: two held-out evaluations of collective verification played by real organisations (the
scripted teacher, a verifier in half the teams, then in every team; `small_run.py`)."""

from __future__ import annotations

from experiments.bench.measure_agreement import markdown, table
from tests.experiments.small_run import evaluate


def test_loop_report_and_bench_agree_on_a_small_run(tmp_path):
    evaluate(tmp_path, 600, 0, verifier_rate=0.5)
    evaluate(tmp_path, 610, 10, verifier_rate=1.0)
    rows = table(str(tmp_path))
    bad = [r for r in rows if not r["agree"]]
    assert not bad, markdown(bad)
    numbers = {(r["arm"], r["measure"]) for r in rows if r["report"] is not None}
    # The organisation has a number for the measures of teams, titles, reviews and their
    # quality; the single agent for none of those (n/a everywhere, in all three).
    for name in ("teams_with_review", "teams_with_review_message", "verifier_title_share",
                 "review_message_precision", "review_message_recall", "reviews_per_team",
                 "shipped_defects_per_rollout", "coordination_time_share",
                 "messages_per_agent", "failed_call_share", "reward"):
        assert ("org", name) in numbers, name
    assert ("single", "reward") in numbers and ("single", "teams_with_review") not in numbers
    assert len(numbers) >= 40
    # The two evaluations differ (more verifiers at the second), so the check is not of
    # two copies of one number.
    by = {(r["step"], r["arm"], r["measure"]): r["report"] for r in rows}
    assert by[(600, "org", "verifier_title_share")] < by[(610, "org", "verifier_title_share")]
