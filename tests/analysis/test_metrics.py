"""Every organisation metric on hand-built logs (tests/analysis/builders.py), the expected
numbers worked out by hand below."""

import math

import pytest

from avalon.analysis.judges import RuleJudge
from avalon.analysis.metrics import (
    RolloutLabels,
    aggregate,
    agreement,
    judge_rollouts,
    messages,
    opening_plan,
    reasoning,
    rollout_metrics,
)
from avalon.analysis.titles import TitleRules
from tests.analysis.builders import single_agent, team_with_lead, team_without_lead

# Labels as a judge would give them (the judge is tested on its own).
LEAD_LABELS = RolloutLabels(
    review={11: "none", 18: "none", 23: "approve", 25: "none"},
    help_offer={11: "no", 18: "yes", 23: "no", 25: "no"},
    help_plan={8: "no", 12: "no", 15: "yes", 21: "no"}, opening_plan="component")
NO_LABELS = RolloutLabels({}, {}, {}, None)
NO_LEAD_LABELS = RolloutLabels({}, {}, {8: "no", 10: "no"}, opening_plan="pipeline")


def test_what_the_judge_is_shown():
    r = team_with_lead()
    assert [m["seq"] for m in messages(r.events)] == [11, 18, 23, 25]
    assert [t["seq"] for t in reasoning(r.events)] == [8, 12, 15, 21]  # specialists only
    assert opening_plan(r.events) == ("Plan: split by component\nhire Lead Engineer: build "
                                      "part a\nhire QA Reviewer: review\nhire Data Analyst: "
                                      "part b")
    assert opening_plan(single_agent().events) is None


def test_team_with_lead():
    m = rollout_metrics(team_with_lead(), LEAD_LABELS)
    assert m.reward == 2.0 and m.hires == 3 and m.budget == 3
    # Lead Engineer: lead + builder; QA Reviewer: reviewer + verifier (qa); Data Analyst: builder.
    assert m.title_classes == {"lead": 1, "reviewer": 1, "verifier": 1, "builder": 2}
    # Clocks: ceo 1.1 -> delivered m4 at a2's 15.1 -> +3000/15000 + 50/50 = 16.3.
    assert math.isclose(m.latency_s, 16.3)
    # Path: ceo's end back through m4's send (a2), m1's send (a1), a1's hire, the CEO's first
    # call: model calls 1 (1550 tokens), 8 (100), 21 (100), 27 (3050) of 4900 tokens in all.
    assert math.isclose(m.critical_token_share, 4800 / 4900)
    assert m.tokens_out == 400
    assert (m.reviews, m.review_tokens) == (1, 100)  # call 21 sent the review
    assert math.isclose(m.review_tokens_per_org_hour, 100 / (16.3 / 3600))
    # Work: model calls 1.1 + 2 + 1 + 1 + 2 + 1.2, tool 10 -> 18.3 s. Co-ordination: call 1
    # (3 hires) 1.1; call 8 half of 2 (work, dm); 12 (wait) 1; 15 (read_trace, dm) 1; 21 (post,
    # report) 2; 27 two thirds of 1.2 (two read_traces, final_message) -> 6.9 s.
    assert math.isclose(m.work_time_s, 18.3)
    assert math.isclose(m.coordination_time_s, 6.9)
    assert (m.help_offerers, m.help_planners) == (1, 1)  # a3
    assert m.opening_plan == "component" and m.lead == "a1"
    assert m.hub == {
        # a3 and the CEO read a1's trace, the CEO a2's; a1 got m2 (dm) and m3 (@a1), a2 m1.
        "lead_trace_reads": 2, "peer_trace_reads": 0.5,
        "lead_messages": 2, "peer_messages": 0.5,
        "ceo_reads_lead": 1, "ceo_reads_peer": 0.5,
        "lead_most_contacted": True,  # contacts a1 4, a2 2, a3 0
        "lead_tool_calls": 2, "lead_coordination_calls": 1,  # work, dm
        "peer_tool_calls": 5, "peer_coordination_calls": 5}


def test_single_agent_and_team_without_lead():
    s = rollout_metrics(single_agent(), NO_LABELS)
    assert (s.reward, s.hires, s.latency_s, s.critical_token_share) == (1.5, 0, 2.1 + 30, 1.0)
    assert (s.work_time_s, s.coordination_time_s, s.hub, s.lead) == (32.1, 0.0, None, None)
    assert not s.team
    t = rollout_metrics(team_without_lead(), NO_LEAD_LABELS)
    assert t.reward == 1.0  # a1's reward was late
    assert t.title_classes == {"lead": 0, "reviewer": 0, "verifier": 1, "builder": 1}
    assert t.latency_s == 7.0  # a1: 1 + 1 + 5
    assert math.isclose(t.critical_token_share, 100 / 150)  # calls 1 and 8 of 1, 8, 10
    assert (t.work_time_s, t.coordination_time_s) == (12.0, 1.0)
    assert t.hub is None and t.reviews == 0 and t.review_tokens_per_org_hour == 0.0


def test_aggregate_over_a_checkpoint():
    ms = [rollout_metrics(team_with_lead(), LEAD_LABELS),
          rollout_metrics(single_agent(), NO_LABELS),
          rollout_metrics(team_without_lead(), NO_LEAD_LABELS)]
    a = aggregate(ms)
    assert (a["rollouts"], a["teams"], a["hires"]) == (3, 2, 5)
    assert a["reward"]["estimate"] == 1.5
    assert a["reward"]["low"] <= 1.5 <= a["reward"]["high"]
    assert [a[f"{c}_title_share"]["estimate"] for c in ("lead", "reviewer", "verifier",
                                                         "builder")] == [0.2, 0.2, 0.4, 0.6]
    assert math.isclose(a["coordination_time_share"], (6.9 + 0 + 1) / (18.3 + 32.1 + 12))
    by = a["coordination_time_share_by_hires"]
    assert by["0"] == 0.0 and math.isclose(by["2"], 1 / 12) and math.isclose(by["3"], 6.9 / 18.3)
    assert a["teams_with_review"]["estimate"] == 0.5
    assert math.isclose(a["review_tokens_per_org_hour"], (100 / (16.3 / 3600) + 0) / 2)
    assert a["help_offer_share"]["estimate"] == 0.2 and a["help_plan_share"]["estimate"] == 0.2
    assert (a["opening_plan_component"]["estimate"], a["opening_plan_pipeline"]["estimate"],
            a["opening_plan_other"]["estimate"]) == (0.5, 0.5, 0.0)
    assert math.isclose(a["latency_s"], (16.3 + 32.1 + 7) / 3)
    assert math.isclose(a["critical_token_share"], (4800 / 4900 + 1 + 100 / 150) / 3)
    assert math.isclose(a["tokens_out"], (400 + 100 + 150) / 3)
    assert a["teams_with_lead_and_peer"] == 1
    hub = a["hub"]
    assert (hub["trace_reads_lead_vs_peer"], hub["messages_lead_vs_peer"],
            hub["ceo_reads_lead_vs_peer"]) == (4.0, 4.0, 2.0)
    assert hub["lead_most_contacted"]["estimate"] == 1.0
    assert (hub["lead_coordination_call_share"], hub["peer_coordination_call_share"]) == (0.5,
                                                                                          1.0)


def test_title_rules_are_data():
    rules = TitleRules({"lead": [r"\bhead\b"], "boss": [r"chief"]})
    assert rules.classify("Head of QA") == {"lead"}
    assert rules.classify("Chief Lead") == {"boss"}
    with pytest.raises(ValueError, match="pattern"):
        TitleRules({"x": ["("]})
    m = rollout_metrics(team_with_lead(), LEAD_LABELS, rules)
    assert m.title_classes == {"lead": 0, "boss": 0} and m.lead is None and m.hub is None


def test_judge_rollouts_labels_in_one_batch_per_rubric():
    calls = []

    class Counting(RuleJudge):
        def label(self, rubric, texts):
            calls.append((rubric.name, len(texts)))
            return super().label(rubric, texts)

    rs = [team_with_lead(), single_agent(), team_without_lead()]
    labels = judge_rollouts(rs, Counting())
    assert calls == [("review", 4), ("help_offer", 4), ("help_plan", 6), ("opening_plan", 2)]
    assert labels[0].review[23] == "approve" and labels[0].help_offer[18] == "yes"
    assert labels[0].help_plan[15] == "yes"
    # The rule judge calls a plan with a reviewer hire a pipeline, whatever the text says.
    assert (labels[0].opening_plan, labels[1].opening_plan, labels[2].opening_plan) == (
        "pipeline", None, "pipeline")


def test_agreement_between_two_judges():
    rs = [team_with_lead(), single_agent(), team_without_lead()]
    rule = judge_rollouts(rs, RuleJudge())
    same = agreement(rule, judge_rollouts(rs, RuleJudge()))
    assert all(v["kappa"] == 1.0 for v in same.values())

    class SaysNo(RuleJudge):  # labels everything with the rubric's fallback
        def label(self, rubric, texts):
            return [rubric.labels[0]] * len(texts)

    a = agreement(rule, judge_rollouts(rs, SaysNo()))
    # review, rule judge: m1 approve ("please review" has the review cue), m2 none, m3 approve,
    # m4 approve ("reviewed"); the other judge: none x 4. p_o = 1/4; p_e = (1/4)(4/4) = 1/4:
    # kappa = 0.
    assert a["review"] == {"items": 4, "kappa": 0.0}
    assert a["opening_plan"]["items"] == 2
