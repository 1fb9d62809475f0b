"""Every measure of `avalon/analysis/metrics.py` on hand-built logs (tests/analysis/builders.py),
the expected numbers worked out by hand below."""

import math
import statistics

import pytest

from avalon.analysis import metrics
from avalon.analysis.judges import RuleJudge
from avalon.analysis.metrics import (
    MEASURES,
    RolloutLabels,
    aggregate,
    agreement,
    estimate,
    judge_rollouts,
    measure,
    messages,
    opening_plan,
    reasoning,
    rollout_metrics,
    shift,
    value,
)
from avalon.analysis.reviews import Build, named_builds
from avalon.analysis.stats import wilson
from avalon.analysis.titles import TitleRules
from tests.analysis.builders import (
    parallel_team,
    single_agent,
    team_with_lead,
    team_without_lead,
    verification_single,
    verification_team,
)

# Labels as a judge would give them (the judge is tested on its own).
LEAD_LABELS = RolloutLabels(
    review={11: "none", 18: "none", 23: "approve", 25: "none"},
    help_offer={11: "no", 18: "yes", 23: "no", 25: "no"},
    help_plan={8: "no", 12: "no", 15: "yes", 21: "no"}, opening_plan="component")
NO_LABELS = RolloutLabels({}, {}, {}, None)
NO_LEAD_LABELS = RolloutLabels({}, {}, {8: "no", 10: "no"}, opening_plan="pipeline")


def _rule(*rollouts):
    labels = judge_rollouts([r.events for r in rollouts], RuleJudge())
    return [rollout_metrics(r.events, lab) for r, lab in zip(rollouts, labels)]


def five():
    """A team with a lead, a single agent, a team without a lead (labels by hand), a
    verification team and a verification single agent (rule judge)."""
    return [rollout_metrics(team_with_lead().events, LEAD_LABELS),
            rollout_metrics(single_agent().events, NO_LABELS),
            rollout_metrics(team_without_lead().events, NO_LEAD_LABELS),
            *_rule(verification_team(), verification_single())]


def test_what_the_judge_is_shown():
    r = team_with_lead()
    assert [m["seq"] for m in messages(r.events)] == [11, 18, 23, 25]
    assert [t["seq"] for t in reasoning(r.events)] == [8, 12, 15, 21]  # specialists only
    assert opening_plan(r.events) == ("Plan: split by component\nhire Lead Engineer: build "
                                      "part a\nhire QA Reviewer: review\nhire Data Analyst: "
                                      "part b")
    assert opening_plan(single_agent().events) is None


def test_team_with_lead():
    m = rollout_metrics(team_with_lead().events, LEAD_LABELS)
    assert m.reward == 2.0 and m.hires == 3 and m.budget == 3 and m.agents == 4
    # Lead Engineer: lead + builder; QA Reviewer: reviewer + verifier (qa); Data Analyst: builder.
    assert m.title_classes == {"lead": 1, "reviewer": 1, "verifier": 1, "builder": 2}
    # Clocks: ceo 1.1 -> delivered m4 at a2's 15.1 -> +3000/15000 + 50/50 = 16.3.
    assert math.isclose(m.latency_s, 16.3)
    # Path: ceo's end back through m4's send (a2), m1's send (a1), a1's hire, the CEO's first
    # call: model calls 1 (1550 tokens), 8 (100), 21 (100), 27 (3050) of 4900 tokens in all.
    assert math.isclose(m.critical_token_share, 4800 / 4900) and m.tokens == 4900
    assert (m.tokens_out, m.tokens_out_ceo) == (400, 100)
    assert (m.messages, m.trace_reads) == (4, 3)  # dm, dm, post, report; a3's and the CEO's 2
    # 13 calls; all but a1's `work` and the CEO's final_message co-ordinate.
    assert (m.tool_calls, m.coordination_calls) == (13, 11)
    assert (m.reviews, m.review_tokens) == (1, 100)  # call 21 sent the review
    # Work: model calls 1.1 + 2 + 1 + 1 + 2 + 1.2, tool 10 -> 18.3 s. Co-ordination: call 1
    # (3 hires) 1.1; call 8 half of 2 (work, dm); 12 (wait) 1; 15 (read_trace, dm) 1; 21 (post,
    # report) 2; 27 two thirds of 1.2 (two read_traces, final_message) -> 6.9 s.
    assert math.isclose(m.work_time_s, 18.3)
    assert math.isclose(m.coordination_time_s, 6.9)
    assert (m.help_offerers, m.help_planners) == (1, 1)  # a3
    assert m.opening_plan == "component" and m.lead == "a1" and m.end_reason == "final_message"
    assert m.hub == {
        # a3 and the CEO read a1's trace, the CEO a2's; a1 got m2 (dm) and m3 (@a1), a2 m1.
        "lead_trace_reads": 2, "peer_trace_reads": 0.5,
        "lead_messages": 2, "peer_messages": 0.5,
        "ceo_reads_lead": 1, "ceo_reads_peer": 0.5,
        "lead_most_contacted": True,  # contacts a1 4, a2 2, a3 0
        "lead_tool_calls": 2, "lead_coordination_calls": 1,  # work, dm
        "peer_tool_calls": 5, "peer_coordination_calls": 5}
    assert not m.review_tally.ground_truth


def test_single_agent_and_team_without_lead():
    s = rollout_metrics(single_agent().events, NO_LABELS)
    assert (s.reward, s.hires, s.latency_s, s.critical_token_share) == (1.5, 0, 2.1 + 30, 1.0)
    assert (s.work_time_s, s.coordination_time_s, s.hub, s.lead) == (32.1, 0.0, None, None)
    assert not s.team
    t = rollout_metrics(team_without_lead().events, NO_LEAD_LABELS)
    assert t.reward == 1.0  # a1's reward was late
    assert t.title_classes == {"lead": 0, "reviewer": 0, "verifier": 1, "builder": 1}
    assert t.latency_s == 7.0  # a1: 1 + 1 + 5
    assert math.isclose(t.critical_token_share, 100 / 150)  # calls 1 and 8 of 1, 8, 10
    assert (t.work_time_s, t.coordination_time_s) == (12.0, 1.0)
    assert (t.tool_calls, t.coordination_calls) == (5, 3)  # two hires and a wait
    assert t.hub is None and t.reviews == 0


def test_verification_rollouts_against_ground_truth():
    d, e = _rule(verification_team(), verification_single())
    # Messages: "p1 47" and "p1 58 p2 33" pass results on (no verdict); five reviews.
    assert (d.messages, d.reviews) == (7, 5)
    # The turns that sent a review: a2's calls 11 and 19, a1's 27: 10 sampled tokens each.
    assert d.review_tokens == 30 and d.opening_plan == "pipeline"  # the rule judge: verifier
    t = d.review_tally
    # "p1 defect" names p1's newest build before it, 47 (defective): a true flag. "p1 58 ok"
    # approves a sound build. "p2 defect" names 33 (sound): a false flag. a1's "p2 61 ok"
    # approves a defective build: a rubber stamp. "reviewed everything" names none.
    assert (t.verdicts, t.unmatched, t.flags, t.true_flags) == (4, 1, 2, 1)
    assert (t.on_defective, t.rubber_stamps, t.approvals) == (2, 1, 2)
    assert (t.shipped, t.shipped_defects) == (2, 1)  # p1 58 sound, p2 61 defective
    # a1 is on the clock's longest chain: 0.41333 (CEO) + 0.20333 + 40 + 40 + 0.20133 + 40
    # + 0.20133 + 40; its model calls and the CEO's first hold 220 + 60 + 30 + 30 of 470 tokens.
    a1 = 0.2 + 50 / 15000  # 50 new prompt tokens, 10 sampled
    b1 = 0.2 + 20 / 15000
    assert math.isclose(d.latency_s, 0.4 + 200 / 15000 + a1 + 2 * b1 + 160)
    assert math.isclose(d.critical_token_share, 340 / 470) and d.tokens == 470
    # Work: model 0.41333 + 2 x 0.20333 + 3 x 0.20133 + 0.202, tools 80 + 20 + 40 + 20 + 40
    # + 10. Co-ordination: the CEO's hires 0.41333; a1's call 6 a third (build, build, dm), 15
    # and 27 halves; a2's 11 half (review, dm), 19 three quarters (review, dm, dm, post).
    assert math.isclose(d.work_time_s, 0.4 + 200 / 15000 + 2 * a1 + 3 * b1 + 0.202 + 210)
    assert math.isclose(d.coordination_time_s,
                        0.4 + 200 / 15000 + a1 / 3 + a1 / 2 + b1 / 2 + b1 * 3 / 4 + b1 / 2)
    assert (d.tool_calls, d.coordination_calls) == (17, 9)
    assert (e.malformed_turns, e.tool_error_turns, e.compactions) == (1, 1, 1)
    # Calls per role and tool: the CEO's wrong-code ship failed, with its error text.
    assert e.calls == {"ceo": {"build": [1, 0], "ship": [2, 1]}}
    assert e.call_errors == {"ship": {"p# has no result '#'": 1}}
    assert d.calls == {"ceo": {"hire": [2, 0], "ship": [2, 0]},
                       "specialist": {"build": [4, 0], "dm": [6, 0], "review": [2, 0],
                                      "post": [1, 0]}}
    assert (d.failed_calls(), e.failed_calls("ceo"), e.failed_calls("specialist")) == (0, 1, 0)
    # The environment's record (D: a2 reviewed a1's p1 47 and p1 58 before the CEO shipped
    # p1 58 and p2 61): one of the two ships was reviewed first.
    assert (t.shipped_reviewed, t.calls_logged) == (1, True)
    assert d.env_metrics["reviews"] == 2.0 and d.env_metrics["defects_found"] == 1.0
    assert e.review_tally.ground_truth and e.review_tally.shipped_defects == 1
    assert math.isclose(e.latency_s, 0.4 + 200 / 15000 + 40 + 2 * b1 + 5)
    assert (e.tokens, e.tokens_out, e.tool_calls) == (280, 40, 3)


# The checkpoint of the five rollouts, every measure by hand: A (team with lead), B (single),
# C (team without lead), D (verification team, budget 3), E (verification single).
HIRES = 3 + 0 + 2 + 2 + 0
AGENTS = 4 + 1 + 3 + 3 + 1
TEAM_HOURS = (16.3 + 7.0 + 161.01933333333335) / 3600
D_WORK = 0.4 + 200 / 15000 + 2 * (0.2 + 50 / 15000) + 3 * (0.2 + 20 / 15000) + 0.202 + 210
D_COORD = 0.935111111111111
BY_HAND = {
    "reward": (2.0 + 1.5 + 1.0 - 1.0 - 2.0) / 5,
    "hires_per_rollout": HIRES / 5,
    "budget_use": (3 / 3 + 2 / 2 + 2 / 3) / 3,  # A, C, D have a budget
    "single_agent_share": 2 / 5,
    "latency_s": (16.3 + 32.1 + 7.0 + 161.01933333333335 + 45.816) / 5,
    "critical_token_share": (4800 / 4900 + 1 + 100 / 150 + 340 / 470 + 1) / 5,
    "tokens_per_rollout": (4900 + 1600 + 150 + 470 + 280) / 5,
    "tokens_out": (400 + 100 + 150 + 80 + 40) / 5,
    "tokens_out_ceo": (100 + 100 + 50 + 30 + 40) / 5,
    "tokens_out_specialists": (300 + 0 + 100 + 50 + 0) / 5,
    "messages_per_agent": (4 + 7) / AGENTS,
    "trace_reads_per_agent": 3 / AGENTS,
    "malformed_turns": 1 / 5, "tool_error_turns": 1 / 5, "compactions": 1 / 5,
    # One failed call, E's ship with a wrong code, of 13 + 2 + 5 + 17 + 3 calls; no
    # specialist's call failed.
    "failed_calls_per_rollout": 1 / 5, "failed_call_share": 1 / 40,
    "failed_calls_ceo": 1 / 5, "failed_calls_per_specialist": 0.0,
    # Hires: Lead Engineer, QA Reviewer, Data Analyst, Engineer, Tester, Builder, Verifier.
    "lead_title_share": 1 / 7, "reviewer_title_share": 1 / 7,
    "verifier_title_share": 3 / 7, "builder_title_share": 4 / 7,
    # Reviews the environment recorded: only D is a team whose environment records them (2
    # reviews by a2, none of its own work, one defect found); D ships 2 and E 1, and of the 3
    # ships only D's p1 58 was reviewed first (by a2, not its builder).
    "teams_with_review": 1.0, "reviews_per_team": 2.0, "self_review_share": 0.0,
    "defects_found_per_team": 1.0, "shipped_per_rollout": (2 + 1) / 2,
    "reviewed_ship_share": 1 / 3,
    # Review messages (the labels): A one, C none, D five.
    "teams_with_review_message": 2 / 3, "review_messages_per_team": (1 + 0 + 5) / 3,
    "review_message_tokens_per_org_hour": (100 + 0 + 30) / TEAM_HOURS,
    # Teams of two or more: A (a3 offers help and plans it), C, D.
    "teams_with_help_offer": 1 / 3, "teams_with_help_plan": 1 / 3,
    "opening_plan_component": 1 / 3, "opening_plan_pipeline": 2 / 3, "opening_plan_other": 0.0,
    "coordination_time_share": (6.9 + 1.0 + D_COORD) / (18.3 + 12.0 + D_WORK),
    "coordination_call_share": (11 + 3 + 9) / (13 + 5 + 17),
    # Only A has a lead and a peer.
    "trace_reads_lead_vs_peer": 2 / 0.5, "messages_lead_vs_peer": 2 / 0.5,
    "ceo_reads_lead_vs_peer": 1 / 0.5, "lead_most_contacted": 1.0,
    "lead_coordination_call_share": 1 / 2, "peer_coordination_call_share": 5 / 5,
    "result_messages": None, "result_handoffs": None,  # no parallel rollout here
    # Only D and E have ground truth; D is the only team with it.
    "review_message_precision": 1 / 2, "review_message_recall": 1 / 2,
    "rubber_stamp_share": 1 / 2,
    "rubber_stamps_per_team": 1.0, "verdicts_per_team": 4.0, "unmatched_review_share": 1 / 5,
    "shipped_defects_per_rollout": (1 + 1) / 2, "shipped_defect_share": 2 / 3,
}


def test_every_measure_over_a_checkpoint_by_hand():
    assert set(BY_HAND) == {m.name for m in MEASURES}
    ms = five()
    for m in MEASURES:
        got, want = value(m, ms), BY_HAND[m.name]
        assert (got is None) == (want is None), m.name
        if want is not None:
            assert math.isclose(got, want, rel_tol=1e-12), (m.name, got, want)
    a = aggregate(ms)
    assert (a["rollouts"], a["teams"], a["hires"]) == (5, 3, HIRES)
    by = a["coordination_time_share_by_hires"]  # C has 2 hires and D 2; A 3
    assert math.isclose(by["2"], (1.0 + D_COORD) / (12.0 + D_WORK))
    assert math.isclose(by["3"], 6.9 / 18.3) and set(by) == {"2", "3"}


def test_parallel_measures_and_what_has_no_denominator():
    f = _rule(parallel_team())[0]
    assert (f.solves, f.result_messages) == (1, 1)  # "s1 7" carries a1's 7; "s3 8" does not
    a = rollout_metrics(team_with_lead().events, LEAD_LABELS)
    assert value(measure("result_messages"), [a, f]) == 1.0  # A called no solve: not counted
    assert value(measure("result_handoffs"), [a, f]) == 1.0
    assert math.isclose(value(measure("coordination_time_share"), [f]), (1 + 2 / 3) / 12)


def test_single_agents_are_n_a_where_a_measure_needs_a_team():
    single = five()[1::3]  # B and E
    a = aggregate(single)
    for name in ("budget_use", "lead_title_share", "teams_with_review", "reviews_per_team",
                 "defects_found_per_team", "teams_with_review_message",
                 "review_messages_per_team", "teams_with_help_offer", "opening_plan_pipeline",
                 "coordination_time_share", "coordination_call_share", "lead_most_contacted",
                 "review_message_precision", "rubber_stamps_per_team",
                 "failed_calls_per_specialist"):
        assert a[name] is None, name
    assert a["reward"]["estimate"] == (1.5 - 2.0) / 2
    assert a["shipped_defects_per_rollout"]["estimate"] == 1.0  # E ships blind
    assert a["shipped_per_rollout"]["estimate"] == 1.0 and a["reviewed_ship_share"] == {
        **a["reviewed_ship_share"], "estimate": 0.0, "count": 0, "of": 1}
    assert a["coordination_time_share_by_hires"] == {}


def test_intervals_and_standard_errors():
    ms = five()
    e = estimate(measure("teams_with_review_message"), ms)
    w = wilson(2, 3)
    assert (e["estimate"], e["low"], e["high"], e["count"], e["of"]) == (
        w.estimate, w.low, w.high, 2, 3)
    assert e["rollouts"] == 3
    # Delta method, rollout as unit: (num, den) = A (1, 1), B (0, 0), C (0, 1), D (1, 1),
    # E (0, 0); R = 2/3, mean den 3/5: z = 5/9, 0, -10/9, 5/9, 0; sd(z) = sqrt(150/81 / 4).
    assert math.isclose(e["se"], math.sqrt(150 / 81 / 4) / math.sqrt(5))
    r = estimate(measure("reward"), ms)  # a mean: se = sd / sqrt(n); bootstrap interval
    rewards = [2.0, 1.5, 1.0, -1.0, -2.0]
    assert math.isclose(r["se"], statistics.stdev(rewards) / math.sqrt(5))
    assert r["low"] < 0.3 < r["high"] and "count" not in r
    assert estimate(measure("review_message_precision"), ms[:3]) is None  # no ground truth
    assert estimate(measure("teams_with_review"), ms[:3]) is None  # no environment record


def test_paired_shift_by_hand():
    a, b, c, d, e = five()
    # reward, pairs (A, B), (C, D), (E, C): differences -0.5, -2, 3.
    s = shift(measure("reward"), [a, c, e], [b, d, c])
    assert s["n"] == 3 and math.isclose(s["diff"], 0.5 / 3)
    assert math.isclose(s["se"], statistics.stdev([-0.5, -2.0, 3.0]) / math.sqrt(3))
    assert math.isclose(s["z"], s["diff"] / s["se"])
    # teams_with_review_message, pairs (A, C), (B, D): first 1/1, last 1/2. z_i = (c_i - R2
    # d_i) / mean(d) - (a_i - R1 b_i) / mean(b): (0 - 0.5) / 1 - 0 = -0.5, (1 - 0.5) / 1 - 0.
    s = shift(measure("teams_with_review_message"), [a, b], [c, d])
    assert (s["first"], s["last"], s["diff"]) == (1.0, 0.5, -0.5)
    assert math.isclose(s["se"], math.sqrt(0.5) / math.sqrt(2)) and math.isclose(s["z"], -1.0)
    assert shift(measure("teams_with_review_message"), [b], [e]) is None  # no team


def test_measures_are_documented_and_old_names_are_aliases():
    for m in MEASURES:
        assert len(m.doc) > 40 and (" over " in m.doc or "Over " in m.doc), m.name
        assert m.basis in metrics.BASES, m.name
    # Every review measure of messages says so in its name; those of the environment's
    # record count actions.
    for m in MEASURES:
        if "review" in m.name and m.basis == metrics.MESSAGES:
            assert "message" in m.name or m.name in ("verdicts_per_team",
                                                       "unmatched_review_share"), m.name
    for name in ("teams_with_review", "reviews_per_team", "defects_found_per_team",
                 "shipped_per_rollout", "shipped_defects_per_rollout"):
        assert measure(name).basis == metrics.ACTIONS, name
    assert measure("review_share") is measure("teams_with_review")
    assert measure("review_precision") is measure("review_message_precision")
    assert measure("review_tokens_per_org_hour") is measure(
        "review_message_tokens_per_org_hour")
    assert measure("coordination_share") is measure("coordination_time_share")
    assert measure("help_offer_share") is measure("teams_with_help_offer")
    with pytest.raises(ValueError, match="no measure 'teams_reviewed'"):
        measure("teams_reviewed")
    assert set(metrics.ALIASES.values()) <= set(metrics.BY_NAME)


def test_title_rules_are_data():
    rules = TitleRules({"lead": [r"\bhead\b"], "boss": [r"chief"]})
    assert rules.classify("Head of QA") == {"lead"}
    assert rules.classify("Chief Lead") == {"boss"}
    with pytest.raises(ValueError, match="pattern"):
        TitleRules({"x": ["("]})
    m = rollout_metrics(team_with_lead().events, LEAD_LABELS, rules)
    assert m.title_classes == {"lead": 0, "boss": 0} and m.lead is None and m.hub is None


def test_judge_rollouts_labels_in_one_batch_per_rubric():
    calls = []

    class Counting(RuleJudge):
        def label(self, rubric, texts):
            calls.append((rubric.name, len(texts)))
            return super().label(rubric, texts)

    rs = [team_with_lead(), single_agent(), team_without_lead()]
    labels = judge_rollouts([r.events for r in rs], Counting())
    assert calls == [("review", 4), ("help_offer", 4), ("help_plan", 6), ("opening_plan", 2)]
    assert labels[0].review[23] == "approve" and labels[0].help_offer[18] == "yes"
    assert labels[0].help_plan[15] == "yes"
    # The rule judge calls a plan with a reviewer hire a pipeline, whatever the text says.
    assert (labels[0].opening_plan, labels[1].opening_plan, labels[2].opening_plan) == (
        "pipeline", None, "pipeline")


def test_agreement_of_two_judges():
    rs = [team_with_lead(), team_without_lead()]
    a = judge_rollouts([r.events for r in rs], RuleJudge())
    same = agreement(a, a)
    assert same["review"] == {"items": 4, "kappa": 1.0}
    assert same["opening_plan"]["items"] == 2


def test_which_build_a_verdict_names():
    builds = [Build("p1", "47", "a1", True, 7), Build("p2", "33", "a1", False, 8),
              Build("p1", "58", "a1", False, 16)]
    assert named_builds("p1 47 ok", 30, builds) == [builds[0]]  # item and its code
    assert named_builds("p1 defect", 10, builds) == [builds[0]]  # newest p1 before seq 10
    assert named_builds("p1 defect", 30, builds) == [builds[2]]
    assert named_builds("p1 99 ok", 30, builds) == []  # a code p1 never had: no build
    assert named_builds("p1 58 p2 33 ok", 30, builds) == [builds[2], builds[1]]
    assert named_builds("p2 33 ok, p2 33 ok", 30, builds) == [builds[1]]  # once
    assert named_builds("p10 47 ok", 30, builds) == [] and named_builds("p3", 30, builds) == []
    assert named_builds("p2 defect", 5, builds) == []  # nothing built yet
