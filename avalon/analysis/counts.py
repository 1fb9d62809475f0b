"""One rollout's counts (`RolloutMetrics`) from its event log and its judge labels: what every
measure of `metrics.py` divides.

1. `judge_rollouts(logs, judge)` labels what a judge must read (messages, specialists'
   reasoning, the opening plan), one judge call per rubric for all rollouts; the training
   loop uses the rule judge, the report the judge it is given, the rule judge by default.
2. `rollout_metrics(events, labels)` counts one rollout.

Two kinds of count, and every measure says which it rests on (`metrics.Measure.basis`):
- *actions*: what the harness and the environment recorded being done: tool calls (failed ones
  flagged by the tool's error), hires, model calls and their tokens, the derived clock, reward
  events, and the environment's own end record (`end` event: `env_metrics`, `env_record`;
  collective verification's `reviews`, `self_reviews`, `defects_found`, `shipped`, ...);
- *messages*: what agents wrote (messages, reasoning, the opening plan), counted or as a judge
  labels it.
A message that reads "p1 47 ok" is a review message whether or not anyone ran a review; only
the environment's record says a review was done.

Terms (ours where the report is silent):
- Specialists are hired agents (`hire` events; the CEO is not one). A *team* is a rollout with
  at least one hire. The agents of a rollout are the CEO and its hires (fired ones too). An
  agent's *role* is `ceo` or `specialist`.
- Messages are `send` events of kind post, dm or report (reactions are not). A *review
  message* is a message the judge labels approve or reject under `judges.REVIEW`; a *help
  offer* one labelled yes under `HELP_OFFER`. *Reasoning* is a specialist's ordinary
  model-call text.
- A *failed call* is a `tool_call` event with `error` set (the tool refused it: a wrong code,
  an unknown tool, a missing argument); a turn whose calls did not parse is a malformed turn,
  not a failed call.
- Title classes: `titles.TitleRules` (non-exclusive).
- Working time: each agent's model and tool seconds on the derived clock (waiting is free). A
  tool call is co-ordination when its tool is an organisation co-ordination tool (every
  organisation tool but the workspace tools and final_message, as `org/tools.py` counts them);
  a model call's seconds are split evenly over the tool calls its turn made (a turn with no
  calls is work).
- Hub: the *lead* is the first hire whose title is of class lead; its *peers* are the other
  hires. Trace reads of X: successful `read_trace` calls naming X (by anyone but X). Messages
  to X: DMs to X plus posts that @-mention X. Contacts: both together.
- Review messages against ground truth: `reviews.py` (collective verification).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Mapping, Sequence

from avalon.analysis.judges import (
    HELP_OFFER,
    HELP_PLAN,
    OPENING_PLAN,
    REVIEW,
    Judge,
    cohen_kappa,
)
from avalon.analysis.logs import reward_of
from avalon.analysis.reviews import ReviewTally, tally
from avalon.analysis.titles import DEFAULT_TITLE_RULES, LEAD, TitleRules
from avalon.org.events import EventKind
from avalon.org.latency import model_call_seconds, replay
from avalon.org.tools import NOT_COORDINATION, OrgTool

CEO, SPECIALIST = "ceo", "specialist"  # roles
ERROR_CHARS = 80  # a failed call's error text, as the report's table quotes it
_COORDINATION = frozenset(t.value for t in OrgTool if t not in NOT_COORDINATION)
_MESSAGE_KINDS = ("post", "dm", "report")
_MENTION = re.compile(r"@([A-Za-z0-9_]+)")
_RESULT = re.compile(r"result (\d+)")
START, MC, TC, SEND, HIRE, COMPACTION, END = (
    EventKind.START.value, EventKind.MODEL_CALL.value, EventKind.TOOL_CALL.value,
    EventKind.SEND.value, EventKind.HIRE.value, EventKind.COMPACTION.value, EventKind.END.value)


# ----- what a judge must label -----------------------------------------------------------------

def messages(events: Sequence[Mapping]) -> list[dict]:
    """The rollout's messages with text (send events of kind post, dm or report)."""
    return [e for e in events if e["kind"] == SEND and e["message_kind"] in _MESSAGE_KINDS
            and e.get("text")]


def reasoning(events: Sequence[Mapping]) -> list[dict]:
    """Specialists' ordinary model calls with text (summary and skipped turns left out)."""
    return [e for e in events if e["kind"] == MC and e["agent"] != "ceo" and e.get("text")
            and not e.get("summary") and not e.get("skipped")]


def opening_plan(events: Sequence[Mapping]) -> str | None:
    """The CEO's first turn as text: what it wrote and whom it hired; None without hires."""
    first = next((e for e in events if e["kind"] == MC and e["agent"] == "ceo"), None)
    if first is None:
        return None
    calls = {e["seq"] for e in events if e["kind"] == TC and e["cause"] == first["seq"]}
    hires = [e for e in events if e["kind"] == HIRE and e["cause"] in calls]
    if not hires:
        return None
    lines = [f"hire {h['title']}: {h.get('role', '')}".rstrip(": ") for h in hires]
    return "\n".join([first.get("text", "").strip(), *lines]).strip()


@dataclasses.dataclass
class RolloutLabels:
    review: dict[int, str]  # send seq -> REVIEW label
    help_offer: dict[int, str]  # send seq -> HELP_OFFER label
    help_plan: dict[int, str]  # model_call seq -> HELP_PLAN label
    opening_plan: str | None  # OPENING_PLAN label (None: not a team)


def judge_rollouts(logs: Sequence[Sequence[Mapping]], judge: Judge) -> list[RolloutLabels]:
    """Labels every rollout's messages, reasoning and opening plan (`logs`: each rollout's
    events): one judge call per rubric."""
    msgs = [messages(ev) for ev in logs]
    thoughts = [reasoning(ev) for ev in logs]
    plans = [opening_plan(ev) for ev in logs]
    flat_msgs = [m["text"] for ms in msgs for m in ms]
    review = judge.label(REVIEW, flat_msgs) if flat_msgs else []
    offer = judge.label(HELP_OFFER, flat_msgs) if flat_msgs else []
    flat_thoughts = [t["text"] for ts in thoughts for t in ts]
    helps = judge.label(HELP_PLAN, flat_thoughts) if flat_thoughts else []
    plan_texts = [p for p in plans if p is not None]
    plan_labels = iter(judge.label(OPENING_PLAN, plan_texts) if plan_texts else [])
    out, i, j = [], 0, 0
    for ms, ts, p in zip(msgs, thoughts, plans):
        out.append(RolloutLabels(
            review={m["seq"]: review[i + k] for k, m in enumerate(ms)},
            help_offer={m["seq"]: offer[i + k] for k, m in enumerate(ms)},
            help_plan={t["seq"]: helps[j + k] for k, t in enumerate(ts)},
            opening_plan=next(plan_labels) if p is not None else None))
        i += len(ms)
        j += len(ts)
    return out


def agreement(a: Sequence[RolloutLabels], b: Sequence[RolloutLabels]) -> dict:
    """Cohen's kappa between two judges' labels of the same rollouts, per rubric (None where
    there was nothing to label), with the number of items."""
    if len(a) != len(b):
        raise ValueError(f"agreement: {len(a)} rollouts against {len(b)}")
    out = {}
    for name in ("review", "help_offer", "help_plan"):
        xs = [lab for r in a for _, lab in sorted(getattr(r, name).items())]
        ys = [lab for r in b for _, lab in sorted(getattr(r, name).items())]
        out[name] = {"items": len(xs), "kappa": cohen_kappa(xs, ys) if xs else None}
    xs = [r.opening_plan for r in a if r.opening_plan is not None]
    ys = [r.opening_plan for r in b if r.opening_plan is not None]
    out["opening_plan"] = {"items": len(xs), "kappa": cohen_kappa(xs, ys) if xs else None}
    return out


# ----- one rollout's counts ------------------------------------------------------------------

@dataclasses.dataclass
class RolloutMetrics:
    reward: float  # the collective reward: every reward event in time (`logs.reward_of`)
    budget: int
    hires: int
    titles: list[str]
    title_classes: dict[str, int]  # class -> hires of that class
    latency_s: float
    critical_token_share: float
    tokens: int  # n_in_new + n_out of every model call
    tokens_out: int
    tokens_out_ceo: int
    messages: int
    trace_reads: int  # successful read_trace calls
    tool_calls: int  # every tool call, failed ones too
    coordination_calls: int
    malformed_turns: int
    tool_error_turns: int  # turns with at least one failed call
    calls: dict[str, dict[str, list[int]]]  # role -> tool -> [calls, failed calls]
    # tool -> error text (when logged; numbers as #) -> failed calls
    call_errors: dict[str, dict[str, int]]
    compactions: int
    end_reason: str
    reviews: int
    review_tokens: int
    work_time_s: float
    coordination_time_s: float
    help_offerers: int  # hires who sent >= 1 help offer
    help_planners: int  # hires whose reasoning planned >= 1 help
    opening_plan: str | None
    lead: str | None  # agent id of the lead
    hub: dict | None  # lead vs peer counts (teams with a lead and a peer)
    solves: int  # `solve` calls (the parallel environment's)
    result_messages: int
    env_metrics: dict[str, float]  # the environment's final metrics (the end event's)
    review_tally: ReviewTally

    @property
    def team(self) -> bool:
        return self.hires > 0

    @property
    def agents(self) -> int:
        return 1 + self.hires

    @property
    def hours(self) -> float:
        return self.latency_s / 3600

    def failed_calls(self, role: str | None = None) -> int:
        """Failed tool calls, of one role (`CEO`, `SPECIALIST`) or of everyone."""
        return sum(c[1] for r, tools in self.calls.items() if role in (None, r)
                   for c in tools.values())

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _working_time(events: Sequence[Mapping]) -> tuple[float, float]:
    calls_of: dict[int, list[Mapping]] = collections.defaultdict(list)
    for e in events:
        if e["kind"] == TC:
            calls_of[e["cause"]].append(e)
    work = coord = 0.0
    for e in events:
        if e["kind"] == MC:
            dt = model_call_seconds(int(e["n_in_new"]), int(e["n_out"]))
            calls = calls_of.get(e["seq"], [])
            work += dt
            if calls:
                coord += dt * sum(c["tool"] in _COORDINATION for c in calls) / len(calls)
        elif e["kind"] == TC:
            dt = float(e["duration_s"])
            work += dt
            if e["tool"] in _COORDINATION:
                coord += dt
    return work, coord


def _hub(events: Sequence[Mapping], lead: str, peers: list[str]) -> dict:
    everyone = [lead, *peers]
    reads = dict.fromkeys(everyone, 0)
    ceo_reads = dict.fromkeys(everyone, 0)
    msgs = dict.fromkeys(everyone, 0)
    calls = dict.fromkeys(everyone, 0)
    coord = dict.fromkeys(everyone, 0)
    for e in events:
        if e["kind"] == TC:
            if e["agent"] in calls:
                calls[e["agent"]] += 1
                coord[e["agent"]] += e["tool"] in _COORDINATION
            if e["tool"] == OrgTool.READ_TRACE.value and not e["error"]:
                target = (e.get("args") or {}).get("agent")
                if target in reads and target != e["agent"]:
                    reads[target] += 1
                    if e["agent"] == "ceo":
                        ceo_reads[target] += 1
        elif e["kind"] == SEND and e["message_kind"] in _MESSAGE_KINDS:
            targets = set()
            if e["message_kind"] == "dm":
                targets |= set(e["to"])
            if e["message_kind"] == "post":
                targets |= set(_MENTION.findall(e.get("text") or "")) & set(e["to"])
            for t in targets - {e["agent"]}:
                if t in msgs:
                    msgs[t] += 1
    contacts = {a: reads[a] + msgs[a] for a in everyone}

    def mean_peers(d):
        return sum(d[p] for p in peers) / len(peers)

    return {
        "lead_trace_reads": reads[lead], "peer_trace_reads": mean_peers(reads),
        "lead_messages": msgs[lead], "peer_messages": mean_peers(msgs),
        "ceo_reads_lead": ceo_reads[lead], "ceo_reads_peer": mean_peers(ceo_reads),
        "lead_most_contacted": all(contacts[lead] > contacts[p] for p in peers),
        "lead_tool_calls": calls[lead], "lead_coordination_calls": coord[lead],
        "peer_tool_calls": sum(calls[p] for p in peers),
        "peer_coordination_calls": sum(coord[p] for p in peers),
    }


def _calls(tool_calls: Sequence[Mapping]) -> tuple[dict, dict]:
    """(role -> tool -> [calls, failed], tool -> error text -> failed calls)."""
    calls: dict[str, dict[str, list[int]]] = {}
    errors: dict[str, dict[str, int]] = {}
    for e in tool_calls:
        c = calls.setdefault(CEO if e["agent"] == "ceo" else SPECIALIST, {}).setdefault(
            e["tool"], [0, 0])
        c[0] += 1
        if e["error"]:
            c[1] += 1
            # numbers masked, so that one kind of error counts once ("p# has no result '#'")
            text = re.sub(r"\d+", "#", " ".join(str(e.get("result", "(not logged)")).split()))
            text = text[:ERROR_CHARS]
            by = errors.setdefault(e["tool"], {})
            by[text] = by.get(text, 0) + 1
    return calls, errors


def _result_messages(events: Sequence[Mapping]) -> int:
    """Messages whose text holds a result code one of its sender's own successful `solve`
    calls returned before it (`s2 correct, result 47`)."""
    mine: dict[str, set[str]] = collections.defaultdict(set)
    n = 0
    for e in events:
        if e["kind"] == TC and e["tool"] == "solve" and not e["error"]:
            mine[e["agent"]].update(_RESULT.findall(str(e.get("result", ""))))
        elif e["kind"] == SEND and e["message_kind"] in _MESSAGE_KINDS:
            n += bool(set(re.findall(r"\b\d+\b", str(e.get("text", "")))) & mine[e["agent"]])
    return n


def rollout_metrics(events: Sequence[Mapping], labels: RolloutLabels,
                    rules: TitleRules = DEFAULT_TITLE_RULES) -> RolloutMetrics:
    """One rollout's counts from its event log and its judge labels."""
    if not events or events[0]["kind"] != START:
        raise ValueError("rollout_metrics needs an event log that begins with its start event")
    hires = [e for e in events if e["kind"] == HIRE]
    titles = [h["title"] for h in hires]
    classes = [rules.classify(t) for t in titles]
    latency = replay(events)
    review_seqs = {s for s, lab in labels.review.items() if lab != REVIEW.labels[0]}
    by_seq = {e["seq"]: e for e in events}
    review_calls = {by_seq[by_seq[s]["cause"]]["cause"] for s in review_seqs}  # send->tc->mc
    specialists = {h["new_agent"] for h in hires}
    offerers = {by_seq[s]["agent"] for s, lab in labels.help_offer.items() if lab == "yes"}
    planners = {by_seq[s]["agent"] for s, lab in labels.help_plan.items() if lab == "yes"}
    work, coord = _working_time(events)
    lead = next((h["new_agent"] for h, c in zip(hires, classes) if LEAD in c), None)
    peers = [h["new_agent"] for h in hires if h["new_agent"] != lead]
    model_calls = [e for e in events if e["kind"] == MC]
    tool_calls = [e for e in events if e["kind"] == TC]
    failed_turns = {e["cause"] for e in tool_calls if e["error"]}
    calls, call_errors = _calls(tool_calls)
    end = events[-1] if events[-1]["kind"] == END else {}
    return RolloutMetrics(
        reward=reward_of(events), budget=int(events[0]["budget"]), hires=len(hires),
        titles=titles,
        title_classes={cls: sum(cls in c for c in classes) for cls in rules.classes},
        latency_s=latency.task_latency_s, critical_token_share=latency.critical_token_share,
        tokens=latency.total_tokens,
        tokens_out=sum(int(e["n_out"]) for e in model_calls),
        tokens_out_ceo=sum(int(e["n_out"]) for e in model_calls if e["agent"] == "ceo"),
        messages=sum(e["kind"] == SEND and e["message_kind"] in _MESSAGE_KINDS for e in events),
        trace_reads=sum(e["tool"] == OrgTool.READ_TRACE.value and not e["error"]
                        for e in tool_calls),
        tool_calls=len(tool_calls),
        coordination_calls=sum(e["tool"] in _COORDINATION for e in tool_calls),
        malformed_turns=sum(bool(e.get("malformed")) for e in model_calls),
        tool_error_turns=len(failed_turns), calls=calls, call_errors=call_errors,
        compactions=sum(e["kind"] == COMPACTION for e in events),
        end_reason=str(end.get("reason", "")),
        reviews=len(review_seqs),
        review_tokens=sum(int(by_seq[s]["n_out"]) for s in review_calls),
        work_time_s=work, coordination_time_s=coord,
        help_offerers=len(offerers & specialists), help_planners=len(planners & specialists),
        opening_plan=labels.opening_plan, lead=lead,
        hub=_hub(events, lead, peers) if lead is not None and peers else None,
        solves=sum(e["tool"] == "solve" for e in tool_calls),
        result_messages=_result_messages(events),
        env_metrics={k: float(v) for k, v in (end.get("env_metrics") or {}).items()},
        review_tally=tally(events, labels.review))

