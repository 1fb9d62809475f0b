"""The organisation's measures (SPEC §5), one definition each, from event logs alone.

Everyone measures with this file: the training loop's metrics (`avalon/train/org_metrics.py`,
as `org/<name>` and `eval/<arm>/<name>`), the run report (`report.py`) and the benchmarks
(`experiments/bench/toy_gain.py`), so one log gives one number whoever reads it.

How a measure is made:
1. `rollout_metrics(events, labels)` (`counts.py`): one rollout's counts from its event log and
   its judge labels (`judge_rollouts`).
2. A measure is a function of one rollout's counts to (numerator, denominator), its docstring
   saying what counts and over what; the checkpoint's value is sum(numerators) /
   sum(denominators) over the checkpoint's rollouts (`value`). A mean per rollout has
   denominator 1; a share over teams has 1 for a team and 0 for the rest; a share over hires
   has the rollout's hires. A checkpoint with no denominator has no value: "n/a" (a single
   agent's rows for every measure that needs a team; a measure of the environment's record
   where the environment keeps none).
3. Every measure says what it counts (`Measure.basis`): `ACTIONS`, what the harness and the
   environment recorded being done (tool calls, hires, model calls, rewards, the
   environment's end record), or `MESSAGES`, what agents wrote (messages, reasoning, plans),
   counted or as a judge labels it (`counts.py`). Reviews come in both kinds under their own
   names: `teams_with_review`, `reviews_per_team`, `defects_found_per_team` are the reviews
   the environment ran (its end record); `teams_with_review_message`,
   `review_messages_per_team` and the verdicts' quality (`review_message_precision`, ...) are
   messages that read as reviews.
4. `estimate` adds a 95% interval (`interval="wilson"`: a share of counted things, Wilson's
   score interval on the pooled counts; `"bootstrap"`: percentile bootstrap over rollouts) and
   the delta-method standard error with the rollout as unit (`stats.ratio_se`); `shift` is the
   paired change between two checkpoints with its SE (`stats.paired_ratio_shift`).

Old names: `ALIASES` maps each name the training loop or the benchmarks used to say to the
measure that replaced it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from avalon.analysis.counts import (  # noqa: F401  (the names callers read from here)
    CEO,
    SPECIALIST,
    RolloutLabels,
    RolloutMetrics,
    agreement,
    judge_rollouts,
    messages,
    opening_plan,
    reasoning,
    rollout_metrics,
)
from avalon.analysis.stats import bootstrap_ratio, paired_ratio_shift, ratio_se, wilson
from avalon.analysis.titles import BUILDER, LEAD, REVIEWER, VERIFIER

ACTIONS, MESSAGES = "actions", "messages"  # what a measure counts (`Measure.basis`)
BASES = {ACTIONS: "actions the harness or the environment recorded (tool calls, hires, model "
                  "calls, rewards, the environment's end record)",
         MESSAGES: "what agents wrote (messages, reasoning, opening plans), counted or "
                   "labelled by a judge"}


# ----- the measures ----------------------------------------------------------------------------
# Each takes one rollout's counts and gives (numerator, denominator); see the module docstring.

Ratio = tuple[float, float]


def reward(m: RolloutMetrics) -> Ratio:
    """Collective reward per rollout: the sum of every agent's reward events that came in time
    (SPEC §3's R_i, no shaping). Mean over rollouts."""
    return m.reward, 1.0


def hires_per_rollout(m: RolloutMetrics) -> Ratio:
    """Hires per rollout (every `hire` event, fired hires too). Mean over rollouts."""
    return float(m.hires), 1.0


def budget_use(m: RolloutMetrics) -> Ratio:
    """Share of the hire budget used: hires / budget per rollout, mean over rollouts with a
    budget (n/a for a single agent)."""
    return (m.hires / m.budget, 1.0) if m.budget > 0 else (0.0, 0.0)


def single_agent_share(m: RolloutMetrics) -> Ratio:
    """Share of rollouts played with budget 0 (a single agent). Over rollouts."""
    return float(m.budget == 0), 1.0


def latency_s(m: RolloutMetrics) -> Ratio:
    """Derived task latency in seconds (SPEC §2, `org/latency.py`). Mean over rollouts."""
    return m.latency_s, 1.0


def critical_token_share(m: RolloutMetrics) -> Ratio:
    """Share of a rollout's model-call tokens on the critical path (1.0 for a single agent).
    Mean over rollouts of the per-rollout share."""
    return m.critical_token_share, 1.0


def tokens_per_rollout(m: RolloutMetrics) -> Ratio:
    """Model-call tokens (new prompt tokens + sampled) per rollout. Mean over rollouts."""
    return float(m.tokens), 1.0


def tokens_out(m: RolloutMetrics) -> Ratio:
    """Sampled (output) tokens per rollout, every agent's. Mean over rollouts."""
    return float(m.tokens_out), 1.0


def tokens_out_ceo(m: RolloutMetrics) -> Ratio:
    """The CEO's sampled tokens per rollout. Mean over rollouts."""
    return float(m.tokens_out_ceo), 1.0


def tokens_out_specialists(m: RolloutMetrics) -> Ratio:
    """The specialists' sampled tokens per rollout (0 for a single agent). Mean over
    rollouts."""
    return float(m.tokens_out - m.tokens_out_ceo), 1.0


def messages_per_agent(m: RolloutMetrics) -> Ratio:
    """Messages (posts, DMs, reports) per agent: all messages / all agents (CEO and hires)
    over the checkpoint's rollouts."""
    return float(m.messages), float(m.agents)


def trace_reads_per_agent(m: RolloutMetrics) -> Ratio:
    """Successful `read_trace` calls per agent: all reads / all agents over the rollouts."""
    return float(m.trace_reads), float(m.agents)


def malformed_turns(m: RolloutMetrics) -> Ratio:
    """Turns whose tool call did not parse, per rollout. Mean over rollouts."""
    return float(m.malformed_turns), 1.0


def tool_error_turns(m: RolloutMetrics) -> Ratio:
    """Turns with at least one failed tool call, per rollout. Mean over rollouts."""
    return float(m.tool_error_turns), 1.0


def compactions(m: RolloutMetrics) -> Ratio:
    """Context compactions (either tier) per rollout. Mean over rollouts."""
    return float(m.compactions), 1.0


def _title_share(m: RolloutMetrics, cls: str) -> Ratio:
    return float(m.title_classes.get(cls, 0)), float(m.hires)


def lead_title_share(m: RolloutMetrics) -> Ratio:
    """Share of hires whose title is of class lead ("lead" in it: `titles.py`). Pooled over
    the hires of every rollout (n/a without a hire). The report: 0.4% -> 12.5%."""
    return _title_share(m, LEAD)


def reviewer_title_share(m: RolloutMetrics) -> Ratio:
    """Share of hires with a reviewing title (review, critic, auditor, QA, quality). Pooled
    over hires. The report: 13% -> 26%."""
    return _title_share(m, REVIEWER)


def verifier_title_share(m: RolloutMetrics) -> Ratio:
    """Share of hires with a verifying title (verif, validat, test, QA, check). Pooled over
    hires. The report: 8% -> 17%."""
    return _title_share(m, VERIFIER)


def builder_title_share(m: RolloutMetrics) -> Ratio:
    """Share of hires with a building title (engineer, developer, builder, analyst, ...).
    Pooled over hires."""
    return _title_share(m, BUILDER)


def _team(m: RolloutMetrics, x: float) -> Ratio:
    return (x, 1.0) if m.team else (0.0, 0.0)


def _recorded_team(m: RolloutMetrics, key: str) -> float | None:
    """The environment's end record of `key` for a team, None for a single agent or where
    the environment records no such thing."""
    return m.env_metrics.get(key) if m.team else None


def teams_with_review(m: RolloutMetrics) -> Ratio:
    """Share of teams where the environment recorded at least one review (its end record's
    `reviews`: review calls that ran on a teammate's build). Over teams whose environment
    records reviews (collective verification; n/a elsewhere)."""
    r = _recorded_team(m, "reviews")
    return (float(r > 0), 1.0) if r is not None else (0.0, 0.0)


def reviews_per_team(m: RolloutMetrics) -> Ratio:
    """Reviews the environment recorded (its end record's `reviews`) per team. Mean over teams
    whose environment records reviews."""
    r = _recorded_team(m, "reviews")
    return (r, 1.0) if r is not None else (0.0, 0.0)


def self_review_share(m: RolloutMetrics) -> Ratio:
    """Of the review calls the environment recorded in teams, the share by the build's own
    builder (`self_reviews`, which find nothing). Pooled over the review calls of teams
    whose environment records them."""
    r, own = _recorded_team(m, "reviews"), _recorded_team(m, "self_reviews")
    return (own, r + own) if r is not None and own is not None else (0.0, 0.0)


def defects_found_per_team(m: RolloutMetrics) -> Ratio:
    """Defects the environment's reviews found (its end record's `defects_found`) per team.
    Mean over teams whose environment records them."""
    r = _recorded_team(m, "defects_found")
    return (r, 1.0) if r is not None else (0.0, 0.0)


def shipped_per_rollout(m: RolloutMetrics) -> Ratio:
    """Builds shipped (the environment's end record, `shipped`) per rollout. Mean over
    rollouts whose environment records ships (a single agent's too)."""
    r = m.env_metrics.get("shipped")
    return (r, 1.0) if r is not None else (0.0, 0.0)


def reviewed_ship_share(m: RolloutMetrics) -> Ratio:
    """Of the shipped builds, the share that a teammate's review call checked before the ship
    (`reviews.py`). Pooled over the ships of rollouts with ground truth and logged call
    arguments."""
    t = m.review_tally
    return (float(t.shipped_reviewed), float(t.shipped)) if t.calls_logged else (0.0, 0.0)


def teams_with_review_message(m: RolloutMetrics) -> Ratio:
    """Share of teams with at least one review message: per team, 1 when any message was
    labelled a review (approve or reject), else 0; over teams (n/a without a team). A
    message, not a review the environment ran (that is `teams_with_review`). The report
    (judged messages): 42% -> 64%."""
    return _team(m, float(m.reviews > 0))


def review_messages_per_team(m: RolloutMetrics) -> Ratio:
    """Messages labelled a review (approve or reject) per team. Mean over teams."""
    return _team(m, float(m.reviews))


def review_message_tokens_per_org_hour(m: RolloutMetrics) -> Ratio:
    """Review-message tokens per organisation-hour: the sampled tokens of the turns that sent
    a review message, over the teams' derived task latency in hours (pooled over teams). The
    report: 0.4k -> 2.9k."""
    return (float(m.review_tokens), m.hours) if m.team else (0.0, 0.0)


def failed_calls_per_rollout(m: RolloutMetrics) -> Ratio:
    """Tool calls that failed (a tool error: a wrong code, an unknown tool, a refused call),
    every agent's, per rollout. Mean over rollouts."""
    return float(m.failed_calls()), 1.0


def failed_call_share(m: RolloutMetrics) -> Ratio:
    """Of the tool calls, the share that failed. Pooled over the calls of every rollout."""
    return float(m.failed_calls()), float(m.tool_calls)


def failed_calls_ceo(m: RolloutMetrics) -> Ratio:
    """The CEO's failed tool calls per rollout. Mean over rollouts."""
    return float(m.failed_calls(CEO)), 1.0


def failed_calls_per_specialist(m: RolloutMetrics) -> Ratio:
    """The specialists' failed tool calls per specialist: pooled over the hires of teams."""
    return float(m.failed_calls(SPECIALIST)), float(m.hires)


def _teams_of_two(m: RolloutMetrics, x: float) -> Ratio:
    return (x, 1.0) if m.hires >= 2 else (0.0, 0.0)


def teams_with_help_offer(m: RolloutMetrics) -> Ratio:
    """Share of teams with two or more specialists where a specialist sent a help offer
    (a message labelled yes under HELP_OFFER). Over those teams. The report: "runs where a
    specialist offers help", about 5% -> over 60%."""
    return _teams_of_two(m, float(m.help_offerers > 0))


def teams_with_help_plan(m: RolloutMetrics) -> Ratio:
    """Share of teams with two or more specialists where a specialist's reasoning planned to
    help a teammate (HELP_PLAN). Over those teams. The report: 10% -> towards 60%."""
    return _teams_of_two(m, float(m.help_planners > 0))


def _plan(m: RolloutMetrics, label: str) -> Ratio:
    if m.opening_plan is None:
        return 0.0, 0.0
    return float(m.opening_plan == label), 1.0


def opening_plan_component(m: RolloutMetrics) -> Ratio:
    """Share of teams whose opening plan (the CEO's first turn and its hires) divides the work
    by component. Over teams with an opening plan. The report: 71% -> 31%."""
    return _plan(m, "component")


def opening_plan_pipeline(m: RolloutMetrics) -> Ratio:
    """Share of teams whose opening plan is a build/test/review pipeline. Over teams with an
    opening plan. The report: 16% -> 54%."""
    return _plan(m, "pipeline")


def opening_plan_other(m: RolloutMetrics) -> Ratio:
    """Share of teams whose opening plan is neither. Over teams with an opening plan."""
    return _plan(m, "other")


def coordination_time_share(m: RolloutMetrics) -> Ratio:
    """Share of working time on co-ordination: co-ordination seconds / working seconds, pooled
    over teams (n/a for a single agent: no one to co-ordinate with). The report: 9% with one
    specialist, 32% with eight."""
    return (m.coordination_time_s, m.work_time_s) if m.team else (0.0, 0.0)


def coordination_call_share(m: RolloutMetrics) -> Ratio:
    """Share of tool calls that are co-ordination calls (every call, failed ones too), pooled
    over teams."""
    return (float(m.coordination_calls), float(m.tool_calls)) if m.team else (0.0, 0.0)


def _hub_ratio(m: RolloutMetrics, a: str, b: str) -> Ratio:
    return (float(m.hub[a]), float(m.hub[b])) if m.hub is not None else (0.0, 0.0)


def trace_reads_lead_vs_peer(m: RolloutMetrics) -> Ratio:
    """Trace reads of the lead / mean trace reads of a peer, pooled over teams with a lead and
    a peer. The report: 15x."""
    return _hub_ratio(m, "lead_trace_reads", "peer_trace_reads")


def messages_lead_vs_peer(m: RolloutMetrics) -> Ratio:
    """Messages to the lead / mean messages to a peer, pooled over teams with a lead and a
    peer. The report: 3.3x."""
    return _hub_ratio(m, "lead_messages", "peer_messages")


def ceo_reads_lead_vs_peer(m: RolloutMetrics) -> Ratio:
    """The CEO's trace reads of the lead / of a peer (mean), pooled over teams with a lead
    and a peer. The report: 25x."""
    return _hub_ratio(m, "ceo_reads_lead", "ceo_reads_peer")


def lead_most_contacted(m: RolloutMetrics) -> Ratio:
    """Share of teams whose lead has strictly more contacts than every peer, over teams with a
    lead and a peer. The report: 78%."""
    return (float(m.hub["lead_most_contacted"]), 1.0) if m.hub is not None else (0.0, 0.0)


def lead_coordination_call_share(m: RolloutMetrics) -> Ratio:
    """The lead's co-ordination calls / its tool calls, pooled over teams with a lead and a
    peer. The report: 6.5% (against 31% for the rest)."""
    return _hub_ratio(m, "lead_coordination_calls", "lead_tool_calls")


def peer_coordination_call_share(m: RolloutMetrics) -> Ratio:
    """The peers' co-ordination calls / their tool calls, pooled over teams with a lead and a
    peer. The report: 31% (against 6.5% for the lead)."""
    return _hub_ratio(m, "peer_coordination_calls", "peer_tool_calls")


def result_messages(m: RolloutMetrics) -> Ratio:
    """Messages carrying a result code their sender's own successful `solve` call returned (a
    result passed on), per rollout; mean over rollouts that called `solve` (the parallel
    environment's)."""
    return (float(m.result_messages), 1.0) if m.solves else (0.0, 0.0)


def result_handoffs(m: RolloutMetrics) -> Ratio:
    """Dependent subtasks solved by someone other than their parent's solver (the parallel
    environment's `handoffs`: a result crossed agents), per rollout; mean over rollouts whose
    environment reports it."""
    h = m.env_metrics.get("handoffs")
    return (h, 1.0) if h is not None else (0.0, 0.0)


def review_message_precision(m: RolloutMetrics) -> Ratio:
    """Of the verdicts (review messages naming a build) that reject a build, the share whose
    build was defective (`reviews.py`). Pooled over verdicts of rollouts with ground truth
    (collective verification)."""
    t = m.review_tally
    return float(t.true_flags), float(t.flags)


def review_message_recall(m: RolloutMetrics) -> Ratio:
    """Of the verdicts (review messages naming a build) on defective builds, the share that
    reject them. Pooled over verdicts of rollouts with ground truth."""
    t = m.review_tally
    return float(t.true_flags), float(t.on_defective)


def rubber_stamp_share(m: RolloutMetrics) -> Ratio:
    """Of the verdicts (review messages naming a build) that approve a build, the share whose
    build was defective (rubber stamps). Pooled over verdicts of rollouts with ground
    truth."""
    t = m.review_tally
    return float(t.rubber_stamps), float(t.approvals)


def rubber_stamps_per_team(m: RolloutMetrics) -> Ratio:
    """Verdicts (review messages) that approve a defective build, per team with ground truth.
    Mean over those teams."""
    t = m.review_tally
    return (float(t.rubber_stamps), 1.0) if t.ground_truth and m.team else (0.0, 0.0)


def verdicts_per_team(m: RolloutMetrics) -> Ratio:
    """Verdicts: review messages matched to a build they name, per team with ground truth
    (message volume that ground truth can check). Mean over those teams."""
    t = m.review_tally
    return (float(t.verdicts), 1.0) if t.ground_truth and m.team else (0.0, 0.0)


def unmatched_review_share(m: RolloutMetrics) -> Ratio:
    """Share of review messages that named no build (so no verdict could be checked), pooled
    over the review messages of rollouts with ground truth."""
    t = m.review_tally
    return (float(t.unmatched), float(m.reviews)) if t.ground_truth else (0.0, 0.0)


def shipped_defects_per_rollout(m: RolloutMetrics) -> Ratio:
    """Shipped builds that were defective (the environment's end record), per rollout with
    ground truth. Mean over those rollouts (a single agent's too: it ships blind)."""
    t = m.review_tally
    return (float(t.shipped_defects), 1.0) if t.ground_truth else (0.0, 0.0)


def shipped_defect_share(m: RolloutMetrics) -> Ratio:
    """Of the shipped builds, the share that were defective (the environment's end record).
    Pooled over ships of rollouts with ground truth."""
    t = m.review_tally
    return float(t.shipped_defects), float(t.shipped)


@dataclasses.dataclass(frozen=True)
class Measure:
    fn: Callable[[RolloutMetrics], Ratio]
    interval: str  # "wilson": a share of counted things; "bootstrap": over rollouts
    over: str  # what the denominator counts (a checkpoint without any: n/a)
    basis: str  # ACTIONS or MESSAGES: what the numerator counts

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def doc(self) -> str:
        return " ".join((self.fn.__doc__ or "").split())


def _w(fn, over: str, basis: str = ACTIONS) -> Measure:
    return Measure(fn, "wilson", over, basis)


def _b(fn, over: str, basis: str = ACTIONS) -> Measure:
    return Measure(fn, "bootstrap", over, basis)


_ROLLOUTS, _TEAMS, _HIRES, _AGENTS = "rollouts", "teams", "hires", "agents"
_HUB, _TRUTH = "teams with a lead and a peer", "rollouts with ground truth"
_REVIEWS = "teams whose environment records reviews"
_M = MESSAGES
MEASURES: tuple[Measure, ...] = (
    _b(reward, _ROLLOUTS), _b(hires_per_rollout, _ROLLOUTS),
    _b(budget_use, "rollouts with a hire budget"), _w(single_agent_share, _ROLLOUTS),
    _b(latency_s, _ROLLOUTS), _b(critical_token_share, _ROLLOUTS),
    _b(tokens_per_rollout, _ROLLOUTS), _b(tokens_out, _ROLLOUTS),
    _b(tokens_out_ceo, _ROLLOUTS), _b(tokens_out_specialists, _ROLLOUTS),
    _b(messages_per_agent, _AGENTS, _M), _b(trace_reads_per_agent, _AGENTS),
    _b(malformed_turns, _ROLLOUTS), _b(tool_error_turns, _ROLLOUTS),
    _b(failed_calls_per_rollout, _ROLLOUTS), _w(failed_call_share, "tool calls"),
    _b(failed_calls_ceo, _ROLLOUTS), _b(failed_calls_per_specialist, _HIRES),
    _b(compactions, _ROLLOUTS),
    _w(lead_title_share, _HIRES), _w(reviewer_title_share, _HIRES),
    _w(verifier_title_share, _HIRES), _w(builder_title_share, _HIRES),
    _w(teams_with_review, _REVIEWS), _b(reviews_per_team, _REVIEWS),
    _w(self_review_share, "review calls of teams (recorded)"),
    _b(defects_found_per_team, _REVIEWS),
    _b(shipped_per_rollout, "rollouts whose environment records ships"),
    _w(reviewed_ship_share, "shipped builds (with ground truth and logged calls)"),
    _b(shipped_defects_per_rollout, _TRUTH), _w(shipped_defect_share, "shipped builds"),
    _w(teams_with_review_message, _TEAMS, _M), _b(review_messages_per_team, _TEAMS, _M),
    _b(review_message_tokens_per_org_hour, _TEAMS, _M),
    _w(teams_with_help_offer, "teams of two or more", _M),
    _w(teams_with_help_plan, "teams of two or more", _M),
    _w(opening_plan_component, "teams with an opening plan", _M),
    _w(opening_plan_pipeline, "teams with an opening plan", _M),
    _w(opening_plan_other, "teams with an opening plan", _M),
    _b(coordination_time_share, _TEAMS), _b(coordination_call_share, _TEAMS),
    _b(trace_reads_lead_vs_peer, _HUB), _b(messages_lead_vs_peer, _HUB, _M),
    _b(ceo_reads_lead_vs_peer, _HUB), _w(lead_most_contacted, _HUB, _M),
    _b(lead_coordination_call_share, _HUB), _b(peer_coordination_call_share, _HUB),
    _b(result_messages, "rollouts that called solve", _M),
    _b(result_handoffs, "rollouts whose environment counts hand-offs"),
    _w(review_message_precision, "verdicts that reject a build (with ground truth)", _M),
    _w(review_message_recall, "verdicts on defective builds (with ground truth)", _M),
    _w(rubber_stamp_share, "verdicts that approve a build (with ground truth)", _M),
    _b(rubber_stamps_per_team, "teams with ground truth", _M),
    _b(verdicts_per_team, "teams with ground truth", _M),
    _w(unmatched_review_share, "review messages (with ground truth)", _M),
)
BY_NAME: Mapping[str, Measure] = {m.name: m for m in MEASURES}
# Names used before this file held every definition, and what replaced them. Not logged.
# `teams_with_review` and `reviews_per_team` counted review messages until the environment's
# record gave them; the message counts are `teams_with_review_message` and
# `review_messages_per_team`.
ALIASES: Mapping[str, str] = {
    # the training loop's share of rollouts with an environment `review` call: 0.79 -> 0.88
    # where the report's judge found 0.00 -> 0.02 on the same logs
    "review_share": "teams_with_review",
    # the training loop's per-rollout share of co-ordination tool calls, single agents too
    "coordination_share": "coordination_time_share",
    # the report's earlier shares of hires who offered (planned) help; the report's figures
    # are shares of teams
    "help_offer_share": "teams_with_help_offer",
    "help_plan_share": "teams_with_help_plan",
    # review measures of messages, named so that they are not read as reviews done
    "review_tokens_per_org_hour": "review_message_tokens_per_org_hour",
    "review_precision": "review_message_precision",
    "review_recall": "review_message_recall",
}


def measure(name: str) -> Measure:
    """The measure called `name` (an old name in `ALIASES` gives its replacement)."""
    name = ALIASES.get(name, name)
    if name not in BY_NAME:
        raise ValueError(f"no measure {name!r}; measures are {sorted(BY_NAME)}")
    return BY_NAME[name]


# ----- per checkpoint ------------------------------------------------------------------------

def parts(m: Measure, ms: Sequence[RolloutMetrics]) -> tuple[np.ndarray, np.ndarray]:
    """Per-rollout numerators and denominators of `m` over `ms`."""
    pairs = [m.fn(r) for r in ms]
    return (np.asarray([p[0] for p in pairs], np.float64),
            np.asarray([p[1] for p in pairs], np.float64))


def sums(m: Measure, ms: Sequence[RolloutMetrics]) -> tuple[float, float]:
    """The sum of `m`'s numerators and of its denominators over `ms`: what rollouts measured
    in several places (the processes of a multi-host run) add before `value` divides."""
    num, den = parts(m, ms)
    return float(num.sum()), float(den.sum())


def value(m: Measure, ms: Sequence[RolloutMetrics]) -> float | None:
    """The measure over `ms`: sum of numerators / sum of denominators (None: n/a)."""
    num, den = sums(m, ms)
    return num / den if den > 0 else None


def estimate(m: Measure, ms: Sequence[RolloutMetrics]) -> dict | None:
    """The measure with its 95% interval and standard error (None: n/a): estimate, low, high,
    se, rollouts (those with a denominator) and, for a Wilson share, count and of."""
    num, den = parts(m, ms)
    if den.sum() <= 0:
        return None
    out = {"rollouts": int(np.sum(den > 0)), "se": ratio_se(num, den)}
    if m.interval == "wilson":
        k, n = int(round(num.sum())), int(round(den.sum()))
        out |= wilson(k, n).to_json() | {"count": k, "of": n}
    else:
        out |= bootstrap_ratio(num, den).to_json()
    return out


def aggregate(ms: Sequence[RolloutMetrics]) -> dict:
    """Every measure over the rollouts of one checkpoint (`estimate`, None where n/a), with
    the numbers of rollouts, teams and hires."""
    if not ms:
        raise ValueError("aggregate of no rollouts")
    return {"rollouts": len(ms), "teams": sum(r.team for r in ms),
            "hires": sum(r.hires for r in ms),
            **{m.name: estimate(m, ms) for m in MEASURES},
            "coordination_time_share_by_hires": coordination_by_hires(ms)}


def coordination_by_hires(ms: Sequence[RolloutMetrics]) -> dict[str, float | None]:
    """`coordination_time_share` per team size (hires, as a string key)."""
    by: dict[int, list[RolloutMetrics]] = collections.defaultdict(list)
    for r in ms:
        if r.team:
            by[r.hires].append(r)
    return {str(k): value(BY_NAME["coordination_time_share"], g) for k, g in sorted(by.items())}


def shift(m: Measure, first: Sequence[RolloutMetrics], last: Sequence[RolloutMetrics]
          ) -> dict | None:
    """The paired change of `m` from `first` to `last` (rollout i of each: the same task and
    seed), with the SE of the difference (`stats.paired_ratio_shift`); None where n/a."""
    a, b = parts(m, first)
    c, d = parts(m, last)
    s = paired_ratio_shift(a, b, c, d)
    return None if s is None else s.to_json()


def end_reason_counts(ms: Sequence[RolloutMetrics]) -> dict[str, int]:
    """Rollouts ending for each reason (the end event's `reason`)."""
    return dict(sorted(collections.Counter(r.end_reason for r in ms).items()))


def end_reasons(ms: Sequence[RolloutMetrics]) -> dict[str, float]:
    """Share of rollouts ending for each reason: `end_reason_counts` over the rollouts."""
    return {reason: n / len(ms) for reason, n in end_reason_counts(ms).items()}


def top_titles(ms: Sequence[RolloutMetrics], k: int = 8) -> dict[str, int]:
    """The k most common job titles over every hire, with their counts."""
    return dict(collections.Counter(t for r in ms for t in r.titles).most_common(k))
