"""Derived latency (SPEC §2): per-agent clocks rebuilt from an event log.

The five rules, as applied to the events of `avalon/org/events.py`:
1. `model_call` advances its agent's clock by n_in_new / 15000 + n_out / 50 seconds (n_in_new
   counts only prompt tokens new to the agent's context).
2. `tool_call` advances it by `duration_s`.
3. Waiting is free: `wait` and `wake` leave clocks alone.
4. `hire` starts the new agent's clock at the hirer's clock (the CEO's, unless `Permissions`
   let specialists hire); `deliver` moves the receiver's clock up to the sender's clock at the
   `send`, if that is later.
5. Task latency is the largest clock.
Our reading of rule 4 for reading (SPEC §2, "our reading"): content an agent reads was made
by its author at the author's clock, so a `tool_call` whose result shows teammates' content
(`read_message`, `read_channel`, `read_trace`, `archive_read`, `archive_list`, `read_file`,
`list_files`) carries `content_seq`, the event at which the newest content returned existed:
a message's `send`; the `model_call` (or, for a prompt, the agent's latest event at that turn
boundary) that brought a trace to the last token returned; the `tool_call` that last wrote a
note (`archive_write`) or a file (`write_file`, or `run_code` that changed it). The reader's
clock moves up to the clock its author had right after that event, if that is later, and then
the call's duration is added (rule 2). Only the seq is logged: the clock is replayed.

Critical path. Each event has a clock predecessor: the event its agent's clock continued from.
That is the agent's previous event, except (a) a `deliver` that moved the clock (send time
strictly later than the receiver's clock) continues from its `send`, (b) a `tool_call` whose
`content_seq` moved the clock continues from that event, and (c) a new agent's first event
continues from its `hire`. The critical path is the chain of predecessors walked back from
the last event of the agent with the largest clock (ties: the agent seen first in the log).
"Tokens" are n_in_new + n_out of model calls; `critical_token_share` = tokens of the model calls
on the path / tokens of all model calls (0 when there are none): 1.0 for a single agent.
`critical_time_s[agent]` = the model and tool time of that agent's events on the path; over all
agents it sums to the task latency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from avalon.org.events import EventKind

IN_TOKENS_PER_S = 15000.0
OUT_TOKENS_PER_S = 50.0


def model_call_seconds(n_in_new: int, n_out: int) -> float:
    """Rule 1."""
    return n_in_new / IN_TOKENS_PER_S + n_out / OUT_TOKENS_PER_S


# The shortest model call that can run a tool: one sampled token, no new prompt (a call that
# sampled nothing, the engine's context-full answer, runs no tool). The clock scheduler's
# default horizon (avalon/org/schedule.py).
MIN_MODEL_CALL_S = model_call_seconds(0, 1)


@dataclasses.dataclass
class LatencyReport:
    task_latency_s: float
    clocks_s: dict[str, float]
    critical_path: list[int]  # event seqs, first to last
    critical_tokens: int
    total_tokens: int
    critical_token_share: float
    critical_time_s: dict[str, float]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _field(event: Mapping, name: str):
    if name not in event:
        raise ValueError(f"event seq {event.get('seq')!r} ({event.get('kind')!r}) has no "
                         f"field {name!r}")
    return event[name]


class ClockReplay:
    """Applies events one by one; `clock(agent)` is live, `report()` summarises."""

    def __init__(self):
        self._clocks: dict[str, float] = {}
        self._last: dict[str, int] = {}  # agent -> seq of its last event
        self._hired_at: dict[str, int] = {}  # new agent -> seq of its hire
        self._send: dict[str, tuple[int, float]] = {}  # message id -> (send seq, send clock)
        self._at: dict[int, float] = {}  # seq -> its agent's clock right after the event
        self._pred: dict[int, int | None] = {}
        self._cost: dict[int, tuple[str, float, int]] = {}  # seq -> (agent, seconds, tokens)
        self._total_tokens = 0

    def clock(self, agent: str) -> float:
        return self._clocks.get(agent, 0.0)

    @property
    def clocks(self) -> Mapping[str, float]:
        return self._clocks

    def clock_at(self, seq: int) -> float:
        """The clock the agent of event `seq` had right after it."""
        if seq not in self._at:
            raise ValueError(f"no event seq {seq!r} applied yet")
        return self._at[seq]

    def apply(self, event: Mapping) -> None:
        seq = _field(event, "seq")
        agent = _field(event, "agent")
        kind = EventKind(_field(event, "kind"))
        if agent not in self._clocks:
            self._clocks[agent] = 0.0
        pred = self._last.get(agent, self._hired_at.get(agent))
        if kind is EventKind.MODEL_CALL:
            n_in, n_out = int(_field(event, "n_in_new")), int(_field(event, "n_out"))
            dt = model_call_seconds(n_in, n_out)
            self._clocks[agent] += dt
            self._cost[seq] = (agent, dt, n_in + n_out)
            self._total_tokens += n_in + n_out
        elif kind is EventKind.TOOL_CALL:
            content = event.get("content_seq")
            if content is not None:
                if content not in self._at or content >= seq:
                    raise ValueError(f"event seq {seq}: content_seq {content!r} is not an "
                                     "earlier event")
                if self._at[content] > self._clocks[agent]:
                    self._clocks[agent] = self._at[content]
                    pred = content
            dt = float(_field(event, "duration_s"))
            self._clocks[agent] += dt
            self._cost[seq] = (agent, dt, 0)
        elif kind is EventKind.SEND:
            self._send[_field(event, "message_id")] = (seq, self._clocks[agent])
        elif kind is EventKind.DELIVER:
            mid = _field(event, "message_id")
            if mid not in self._send:
                raise ValueError(f"event seq {seq}: deliver of {mid!r} before its send")
            send_seq, send_clock = self._send[mid]
            if send_clock > self._clocks[agent]:
                self._clocks[agent] = send_clock
                pred = send_seq
        elif kind is EventKind.HIRE:
            new = _field(event, "new_agent")
            self._clocks[new] = self._clocks[agent]
            self._hired_at[new] = seq
        self._pred[seq] = pred
        self._last[agent] = seq
        self._at[seq] = self._clocks[agent]

    def report(self) -> LatencyReport:
        if not self._clocks:
            return LatencyReport(0.0, {}, [], 0, 0, 0.0, {})
        top = max(self._clocks.values())
        head = next(a for a, c in self._clocks.items() if c == top)
        path: list[int] = []
        seq = self._last.get(head, self._hired_at.get(head))
        while seq is not None:
            path.append(seq)
            seq = self._pred[seq]
        path.reverse()
        crit_tokens = 0
        crit_time: dict[str, float] = {a: 0.0 for a in self._clocks}
        for s in path:
            if s in self._cost:
                agent, dt, tokens = self._cost[s]
                crit_time[agent] += dt
                crit_tokens += tokens
        share = crit_tokens / self._total_tokens if self._total_tokens else 0.0
        return LatencyReport(task_latency_s=top, clocks_s=dict(self._clocks), critical_path=path,
                             critical_tokens=crit_tokens, total_tokens=self._total_tokens,
                             critical_token_share=share, critical_time_s=crit_time)


def replay(events: Iterable[Mapping]) -> LatencyReport:
    """The derived-latency report of a whole event log."""
    clocks = ClockReplay()
    for event in events:
        clocks.apply(event)
    return clocks.report()
