"""The organisation metrics of SPEC §5, per rollout (`rollout_metrics`) and per checkpoint
(`aggregate`), from event logs alone. Texts that need judging (messages, reasoning, opening
plans) are labelled first, in one batch per rubric for a whole run (`judge_rollouts`).

Definitions (ours where the report is silent; each says so):
- Specialists are the hired agents (`hire` events; the CEO is not one). A *team* is a rollout
  with at least one hire.
- Title classes: `titles.TitleRules` (non-exclusive). Shares are pooled over hires.
- Messages: `send` events of kind post, dm or report with text. A *review* is a message the
  judge labels approve or reject under `judges.REVIEW`; a *help offer* one labelled yes under
  `HELP_OFFER`. *Reasoning* is a specialist's ordinary model-call text (`HELP_PLAN`).
- Review tokens: n_out of the model calls whose turn sent a review; per organisation-hour
  (our reading) = review tokens / (task latency in hours).
- Working time (our reading of "share of working time on coordination"): each agent's model
  and tool seconds on the derived clock (waiting is free, so not work). A tool call's seconds
  are co-ordination when its tool is an organisation co-ordination tool (every organisation
  tool but the workspace tools and final_message, as `org/tools.py` counts them); a model
  call's seconds are split evenly over the tool calls its turn made, and a turn with no calls
  counts as work. Co-ordination time share = co-ordination seconds / working seconds.
- Hub statistics: the *lead* is the first hire whose title is of class lead; its *peers* are
  the other hires. Trace reads of X: successful `read_trace` calls with agent X (by anyone but
  X). Messages to X: DMs to X plus posts that @-mention X. Contacts of X: both together. "Lead
  vs a peer" ratios are pooled over teams with a lead and a peer: total for the lead / total
  mean over the team's peers. The lead is *most contacted* when it has strictly more contacts
  than every other hire (teams with a lead and a peer). The co-ordination share of tool calls
  (every call, failed ones too, as the organisation counts them) is for the lead and the peers.
- Critical-path token share and latency: `avalon/org/latency.py` on the log.
- Opening plan: the CEO's first model call (its text) and the hires it made, labelled under
  `OPENING_PLAN` (teams only).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Mapping, Sequence

import numpy as np

from avalon.analysis.judges import (
    HELP_OFFER,
    HELP_PLAN,
    OPENING_PLAN,
    REVIEW,
    Judge,
    cohen_kappa,
)
from avalon.analysis.logs import LoggedRollout, reward_of
from avalon.analysis.stats import bootstrap_mean, wilson
from avalon.analysis.titles import DEFAULT_TITLE_RULES, LEAD, TitleRules
from avalon.org.events import EventKind
from avalon.org.latency import model_call_seconds, replay
from avalon.org.tools import NOT_COORDINATION, OrgTool

_COORDINATION = frozenset(t.value for t in OrgTool if t not in NOT_COORDINATION)
_MESSAGE_KINDS = ("post", "dm", "report")
_MENTION = re.compile(r"@([A-Za-z0-9_]+)")
MC, TC, SEND, HIRE = (EventKind.MODEL_CALL.value, EventKind.TOOL_CALL.value,
                      EventKind.SEND.value, EventKind.HIRE.value)


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


def judge_rollouts(rollouts: Sequence[LoggedRollout], judge: Judge) -> list[RolloutLabels]:
    """Labels every rollout's messages, reasoning and opening plan: one judge call per rubric."""
    msgs = [messages(r.events) for r in rollouts]
    thoughts = [reasoning(r.events) for r in rollouts]
    plans = [opening_plan(r.events) for r in rollouts]
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


# ----- one rollout ---------------------------------------------------------------------------

@dataclasses.dataclass
class RolloutMetrics:
    reward: float
    budget: int
    hires: int
    titles: list[str]
    title_classes: dict[str, int]  # class -> hires of that class
    latency_s: float
    critical_token_share: float
    tokens_out: int
    reviews: int
    review_tokens: int
    review_tokens_per_org_hour: float
    work_time_s: float
    coordination_time_s: float
    help_offerers: int  # hires who sent >= 1 help offer
    help_planners: int  # hires whose reasoning planned >= 1 help
    opening_plan: str | None
    lead: str | None  # agent id of the lead
    hub: dict | None  # lead vs peer counts (teams with a lead and a peer)

    @property
    def team(self) -> bool:
        return self.hires > 0

    @property
    def coordination_time_share(self) -> float:
        return self.coordination_time_s / self.work_time_s if self.work_time_s else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["coordination_time_share"] = self.coordination_time_share
        return d


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


def rollout_metrics(rollout: LoggedRollout, labels: RolloutLabels,
                    rules: TitleRules = DEFAULT_TITLE_RULES) -> RolloutMetrics:
    events = rollout.events
    hires = [e for e in events if e["kind"] == HIRE]
    titles = [h["title"] for h in hires]
    classes = [rules.classify(t) for t in titles]
    latency = replay(events)
    review_seqs = {s for s, lab in labels.review.items() if lab != REVIEW.labels[0]}
    by_seq = {e["seq"]: e for e in events}
    review_calls = {by_seq[by_seq[s]["cause"]]["cause"] for s in review_seqs}  # send->tc->mc
    review_tokens = sum(int(by_seq[s]["n_out"]) for s in review_calls)
    hours = latency.task_latency_s / 3600
    specialists = {h["new_agent"] for h in hires}
    offerers = {by_seq[s]["agent"] for s, lab in labels.help_offer.items() if lab == "yes"}
    planners = {by_seq[s]["agent"] for s, lab in labels.help_plan.items() if lab == "yes"}
    work, coord = _working_time(events)
    lead = next((h["new_agent"] for h, c in zip(hires, classes) if LEAD in c), None)
    peers = [h["new_agent"] for h in hires if h["new_agent"] != lead]
    return RolloutMetrics(
        reward=reward_of(events), budget=rollout.budget, hires=len(hires), titles=titles,
        title_classes={cls: sum(cls in c for c in classes) for cls in rules.classes},
        latency_s=latency.task_latency_s, critical_token_share=latency.critical_token_share,
        tokens_out=sum(int(e["n_out"]) for e in events if e["kind"] == MC),
        reviews=len(review_seqs), review_tokens=review_tokens,
        review_tokens_per_org_hour=review_tokens / hours if hours > 0 else 0.0,
        work_time_s=work, coordination_time_s=coord,
        help_offerers=len(offerers & specialists), help_planners=len(planners & specialists),
        opening_plan=labels.opening_plan, lead=lead,
        hub=_hub(events, lead, peers) if lead is not None and peers else None)


# ----- per checkpoint ------------------------------------------------------------------------

def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _share(k: int, n: int) -> dict | None:
    return wilson(k, n).to_json() if n else None


def aggregate(ms: Sequence[RolloutMetrics], rules: TitleRules = DEFAULT_TITLE_RULES) -> dict:
    """The checkpoint-level numbers of SPEC §5 over rollouts of one (step, arm)."""
    if not ms:
        raise ValueError("aggregate of no rollouts")
    rewards = [m.reward for m in ms]
    teams = [m for m in ms if m.team]
    n_hires = sum(m.hires for m in ms)
    out: dict = {
        "rollouts": len(ms), "teams": len(teams), "hires": n_hires,
        "reward": bootstrap_mean(rewards).to_json(),
        "latency_s": float(np.mean([m.latency_s for m in ms])),
        "tokens_out": float(np.mean([m.tokens_out for m in ms])),
        "critical_token_share": float(np.mean([m.critical_token_share for m in ms])),
        "hires_per_rollout": n_hires / len(ms),
    }
    for cls in rules.classes:
        out[f"{cls}_title_share"] = _share(sum(m.title_classes.get(cls, 0) for m in ms),
                                           n_hires)
    work = sum(m.work_time_s for m in ms)
    out["coordination_time_share"] = _ratio(sum(m.coordination_time_s for m in ms), work)
    by_size: dict[int, list[RolloutMetrics]] = collections.defaultdict(list)
    for m in ms:
        by_size[m.hires].append(m)
    out["coordination_time_share_by_hires"] = {
        str(k): _ratio(sum(m.coordination_time_s for m in g), sum(m.work_time_s for m in g))
        for k, g in sorted(by_size.items())}
    out["teams_with_review"] = _share(sum(m.reviews > 0 for m in teams), len(teams))
    out["review_tokens_per_org_hour"] = (float(np.mean([m.review_tokens_per_org_hour
                                                        for m in teams])) if teams else None)
    out["help_offer_share"] = _share(sum(m.help_offerers for m in teams), n_hires)
    out["help_plan_share"] = _share(sum(m.help_planners for m in teams), n_hires)
    plans = collections.Counter(m.opening_plan for m in teams if m.opening_plan is not None)
    n_plans = sum(plans.values())
    for lab in OPENING_PLAN.labels:
        out[f"opening_plan_{lab}"] = _share(plans.get(lab, 0), n_plans)
    hubs = [m.hub for m in ms if m.hub is not None]
    out["teams_with_lead_and_peer"] = len(hubs)

    def pooled(a, b):
        return _ratio(sum(h[a] for h in hubs), sum(h[b] for h in hubs))

    out["hub"] = {
        "trace_reads_lead_vs_peer": pooled("lead_trace_reads", "peer_trace_reads"),
        "messages_lead_vs_peer": pooled("lead_messages", "peer_messages"),
        "ceo_reads_lead_vs_peer": pooled("ceo_reads_lead", "ceo_reads_peer"),
        "lead_most_contacted": _share(sum(h["lead_most_contacted"] for h in hubs), len(hubs)),
        "lead_coordination_call_share": pooled("lead_coordination_calls", "lead_tool_calls"),
        "peer_coordination_call_share": pooled("peer_coordination_calls", "peer_tool_calls"),
    } if hubs else None
    return out

