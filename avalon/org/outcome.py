"""What a finished organisation hands on: the RL core's `Rollout`, and an `OrgReport`.

`Rollout.metrics` (floats, for the training driver's telemetry):
  latency_s, critical_token_share, tokens (n_in_new + n_out of every model call), tokens_out,
  tokens_out_ceo, tokens_out_specialists, agents, hires, fires, model_calls, tool_calls,
  worked (specialists that worked: `workers`), messages, trace_reads,
  compactions, malformed_turns, tool_error_turns, end/<reason> (1.0 for the episode's end
  reason), and per agent `<id>/tokens_out`, `<id>/messages`, `<id>/trace_reads`,
  `<id>/critical_time_s`.
  These are the episode's counts, not the organisation's measures: shares and rates (the
  co-ordination share of working time, reviews per team, ...) have one definition each, in
  `avalon/analysis/metrics.py`, measured from `Rollout.events` (`train/org_metrics.py`).
`Rollout.info` (plain JSON values, for the training driver's logs of what is not a float):
  titles (the specialists' job titles in hire order, fired ones too), end_reason (EndReason
  value), tokens_out_by_title (sampled tokens summed per job title, "CEO" included).
`OrgReport` carries the same titles by agent id, the end reason and the CEO's final message.
"""

from __future__ import annotations

import dataclasses

from avalon.org.agents import AgentState
from avalon.org.events import EventKind
from avalon.org.organisation import Organisation
from avalon.org.tools import OrgTool
from avalon.rl.types import Rollout


@dataclasses.dataclass(frozen=True)
class OrgReport:
    titles: dict[str, str]  # agent id -> job title, every agent ever hired
    end_reason: str
    final_message: str | None


# Calls that change nothing for the team: waiting, and looking at who is in it.
IDLE_TOOLS = frozenset({OrgTool.WAIT_FOR_MESSAGES.value, OrgTool.ROSTER.value})


def workers(events) -> set[str]:
    """The specialists that worked: those with at least one successful tool call, other than
    waiting or the roster, in a turn that ran (skipped turns log no calls).

    This is the underhire penalty's "used budget" (`Rollout.worked`, rl/advantages.py). Counting
    hires instead would let a policy cancel the penalty for nothing: hire and at once fire, or
    hire an agent that only waits. An agent counts once it did anything with an effect on the
    task or the team (an environment or workspace tool, a message, a note, a read), so the way
    out of the penalty is to use the hires, which is what the penalty is for (SPEC §3).
    """
    return {e["agent"] for e in events
            if e["kind"] == "tool_call" and e["agent"] != "ceo" and not e["error"]
            and e["tool"] not in IDLE_TOOLS}


def build_rollout(org: Organisation) -> Rollout:
    """The finished episode as the RL core's `Rollout` (call after the episode ended)."""
    if not org.done:
        raise ValueError(f"rollout {org.rollout}: the episode has not ended")
    rows = []
    for a in org.agents.values():
        a.context.close_row()
        rows += a.context.rows
    report = org.clocks.report()
    agents = list(org.agents.values())
    stats = [a.stats for a in agents]
    tool_calls = sum(s.tool_calls for s in stats)
    metrics = {
        "latency_s": report.task_latency_s,
        "critical_token_share": report.critical_token_share,
        "tokens": float(report.total_tokens),
        "tokens_out": float(org.tokens_out),
        "tokens_out_ceo": float(org.agents["ceo"].stats.tokens_out if "ceo" in org.agents
                                else 0),
        "tokens_out_specialists": float(sum(a.stats.tokens_out for a in agents
                                            if a.id != "ceo")),
        "agents": float(len(agents)),
        "hires": float(org.hires),
        "fires": float(sum(a.state is AgentState.FIRED for a in agents)),
        "model_calls": float(sum(s.model_calls for s in stats)),
        "tool_calls": float(tool_calls),
        "messages": float(sum(s.messages_sent for s in stats)),
        "trace_reads": float(sum(s.trace_reads for s in stats)),
        "compactions": float(sum(e["kind"] == EventKind.COMPACTION.value
                                 for e in org.log.events)),
        "malformed_turns": float(sum(s.malformed_turns for s in stats)),
        "tool_error_turns": float(sum(s.tool_error_turns for s in stats)),
        f"end/{org.end_reason.value}": 1.0,
    }
    for a in agents:
        metrics[f"{a.id}/tokens_out"] = float(a.stats.tokens_out)
        metrics[f"{a.id}/messages"] = float(a.stats.messages_sent)
        metrics[f"{a.id}/trace_reads"] = float(a.stats.trace_reads)
        metrics[f"{a.id}/critical_time_s"] = report.critical_time_s.get(a.id, 0.0)
    metrics.update({f"env/{k}": float(v) for k, v in org.final.metrics.items()})
    by_title: dict[str, int] = {}
    for a in agents:
        by_title[a.title] = by_title.get(a.title, 0) + a.stats.tokens_out
    info = {"titles": [a.title for a in agents if a.id != "ceo"],
            "end_reason": org.end_reason.value, "tokens_out_by_title": by_title}
    metrics["worked"] = float(len(workers(org.log.events)))
    return Rollout(rows=rows, rewards=list(org.rewards), budget=org.budget, hires=org.hires,
                   worked=len(workers(org.log.events)),
                   wealth_ratio=org.final.wealth_ratio, metrics=metrics, info=info,
                   events=org.log.events)


def org_report(org: Organisation) -> OrgReport:
    return OrgReport(titles={a.id: a.title for a in org.agents.values()},
                     end_reason=org.end_reason.value if org.end_reason else "",
                     final_message=org.final_message)
