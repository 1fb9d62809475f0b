"""The report's shifts table, learning paragraph, intervals on every curve, RL-step axes and
panels that say in words why they are empty (hand-built run; numbers worked out by hand)."""

from __future__ import annotations

import math
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from avalon.analysis.learning import describe  # noqa: E402
from avalon.analysis.report import PUBLISHED, analyse  # noqa: E402
from avalon.analysis.report_pages import (  # noqa: E402
    _curve_panel,
    index_html,
    shifts_markdown,
    why_empty,
)
from tests.analysis.builders import (  # noqa: E402
    single_agent,
    team_with_lead,
    team_without_lead,
    verification_team,
    with_task,
    write_eval_step,
)


def _write(run, step, rl_step, logs):
    write_eval_step(run, step, rl_step, "verification", [(arm, 0, ev) for arm, ev in logs])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Organisation: t1 team_with_lead -> verification_team, t2 team_without_lead ->
    team_with_lead (rewards 2, 1 -> -1, 2); the single agent 1.5 on both, both times."""
    run = tmp_path_factory.mktemp("run")
    single = [("single", with_task(single_agent(), t)) for t in ("t1", "t2")]
    _write(run, 600, 0, [("org", with_task(team_with_lead(), "t1")),
                         ("org", with_task(team_without_lead(), "t2")), *single])
    _write(run, 700, 20, [("org", with_task(verification_team(), "t1")),
                          ("org", with_task(team_with_lead(), "t2")), *single])
    rep, _ = analyse(str(run), commit="abc1234")
    return rep


def test_shifts_pair_rollouts_and_stand_beside_the_published_figures(report):
    s = report["shifts"]
    assert (s["first_step"], s["last_step"], s["first_rl_step"], s["last_rl_step"]) == (
        600, 700, 0, 20)
    org = {r["measure"]: r for r in s["arms"]["org"]["rows"]}
    assert s["arms"]["org"]["pairs"] == 2
    r = org["reward"]  # differences -3 and +1
    assert (r["first"], r["last"], r["diff"]) == (1.5, 0.5, -1.0)
    assert r["se"] == pytest.approx(statistics.stdev([-3, 1]) / math.sqrt(2))
    assert r["z"] == pytest.approx(-0.5)
    # The rule judge finds reviews in team_with_lead and the verification team, none in
    # team_without_lead: 1/2 -> 2/2; pairs z = (c - d) - (a - b/2)/... by the delta method:
    # R1 = 1/2, R2 = 1; z_i = (c_i - 1) - (a_i - 1/2) = [0 - 0.5, 0 + 0.5] -> sd sqrt(0.5).
    t = org["teams_with_review_message"]
    assert (t["first"], t["last"], t["basis"]) == (0.5, 1.0, "messages")
    assert t["se"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))
    assert t["published"] == PUBLISHED["teams_with_review_message"] == "42% -> 64%"
    # Reviews the environment ran: only the verification team at step 700 has a record, so
    # the pairs have none to compare (n/a), and the row says it counts actions.
    ran = org["teams_with_review"]
    assert (ran["first"], ran["last"], ran["basis"]) == (None, None, "actions")
    # Review quality: no ground truth at the first evaluation, so no shift.
    assert org["review_message_precision"]["first"] is None
    single = {r["measure"]: r for r in s["arms"]["single"]["rows"]}
    assert single["teams_with_review_message"]["first"] is None  # n/a: no team
    assert single["reward"]["diff"] == 0.0 and single["reward"]["published"] is None
    by = s["coordination_by_team_size"]
    assert set(by["first"]) == {"2", "3"} and by["published"] == {"1": 0.09, "8": 0.32}


def test_org_against_single_paired_by_task_and_seed(report):
    last = report["comparisons"][-1]
    assert last["rl_step"] == 20
    p = last["paired"]  # org -1, 2 against 1.5, 1.5
    assert (p["n"], p["diff"]) == (2, -1.0)
    assert p["se"] == pytest.approx(statistics.stdev([-2.5, 0.5]) / math.sqrt(2))


def test_the_learning_paragraph_is_the_reports_numbers(report):
    text = report["learning"]
    assert "commit abc1234" in text and "between RL step 0 and 20" in text
    assert "held-out reward 1.50 -> 0.50 (-0.5 SE)" in text
    assert "teams with a review message 50% -> 100% (+1.0 SE)" in text
    # No environment record of reviews at both evaluations: the messages are not reviews.
    assert "Reviews the environment ran" not in text
    assert "Messages that read as reviews (no record of reviews by the environment" in text
    real = [r for r in report["shifts"]["arms"]["org"]["rows"]
            if r.get("z") is not None and abs(r["z"]) >= 3]
    assert real and all(r["measure"] != "reward" for r in real)  # 2 pairs: noise can be big
    listed = text.split("Shifts of 3 SE or more: ")[1].split(";")[0].split(", ")
    assert len(listed) == len(real)


def test_every_curve_has_an_interval_on_the_rl_step(report):
    curves = report["curves"]
    for name, arms in curves.items():
        for arm, pts in arms.items():
            for x, y, lo, hi in pts:
                assert x in (0, 20) and lo <= y <= hi, (name, arm)
    assert [p[0] for p in curves["teams_with_review_message"]["org"]] == [0, 20]
    assert "single" not in curves["teams_with_review_message"]  # n/a for the single agent
    assert [p[0] for p in curves["review_message_precision"]["org"]] == [20]  # truth at 20
    assert [p[0] for p in curves["teams_with_review"]["org"]] == [20]  # the record at 20
    fig, (a, b) = plt.subplots(1, 2)
    _curve_panel(a, "teams_with_review_message", curves)
    assert a.get_title() == "teams_with_review_message [messages]"
    assert a.collections and a.get_xlabel() == "RL step"  # the band, and the RL step
    assert all(float(x).is_integer() for x in a.get_xticks())
    _curve_panel(b, "result_messages", curves)  # nothing to draw: said in words
    assert not b.lines and not b.get_xticks().size
    assert [t.get_text().replace("\n", " ") for t in b.texts] == [why_empty("result_messages")]
    assert why_empty("result_messages") == ("n/a at every evaluation: no rollouts that called "
                                            "solve in these logs")
    plt.close(fig)


def test_the_page_says_n_a_and_shows_the_shifts(report):
    page = index_html(report, {}, [], [])
    assert "Shifts from RL step 0 to 20" in page and "42% -&gt; 64%" in page
    assert "<td>n/a</td>" in page and "What it learnt" in page
    assert ("teams_with_review_message</td><td>messages</td><td>Share of teams with at least "
            "one review message") in page
    assert "teams_with_review</td><td>actions</td><td>Share of teams where the environment" \
        in page


def test_a_page_to_publish_shows_the_png_files_beside_it(report):
    page = index_html(report, {"rewards": b"\x89PNG"}, [], [], embed_images=False)
    assert '<img alt="rewards" src="rewards.png">' in page and "base64" not in page


def test_the_paragraph_keeps_a_small_shares_digits():
    row = {"measure": "coordination_time_share", "first": 0.0171, "last": 0.0169, "z": -0.34}
    assert describe(row) == "1.7% -> 1.7% (-0.3 SE)"
    row = {"measure": "teams_with_review_message", "first": 0.857, "last": 0.957, "z": 1.6}
    assert describe(row) == "86% -> 96% (+1.6 SE)"
    assert describe({"measure": "hires_per_rollout", "first": 2.54, "last": None}) == "n/a"


def test_the_shifts_in_markdown(report):
    text = shifts_markdown(report)
    assert text.startswith("Shifts from RL step 0 to 20, at commit abc1234")
    assert ("| teams_with_review_message | messages | 0.5 | 1 | +0.5 ± 0.5 (+1.0 SE) | "
            "42% -> 64% |") in text
    assert "| teams_with_review | actions | n/a | n/a | n/a | not measured |" in text
    assert "single (2 pairs):" in text
