"""An agent of an organisation: identity, granted tools, state, context and counters."""

from __future__ import annotations

import bisect
import dataclasses
import enum
from typing import TYPE_CHECKING

from avalon.org.context import AgentContext

if TYPE_CHECKING:
    from avalon.org.schedule import Work


class AgentState(enum.Enum):
    READY = "ready"  # acts at its next turn boundary (avalon/org/schedule.py)
    PARKED = "parked"  # in wait_for_messages: costs nothing until a waking delivery
    STOPPED = "stopped"  # turn cap, wall clock or context full (a logged `stop`)
    FIRED = "fired"


class StopReason(enum.Enum):
    MAX_TURNS = "max_turns"
    WALL_CLOCK = "wall_clock"
    CONTEXT_FULL = "context_full"


@dataclasses.dataclass
class AgentStats:
    tokens_in: int = 0  # n_in_new summed
    tokens_out: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    coordination_calls: int = 0  # calls of organisation tools (messages, channels, traces, ...)
    messages_sent: int = 0
    trace_reads: int = 0
    malformed_turns: int = 0
    tool_error_turns: int = 0


@dataclasses.dataclass
class Agent:
    id: str  # "ceo", "a1", "a2", ... (hire order; never reused)
    index: int  # 0 for the CEO, then hire order
    title: str
    role: str
    brief: str  # private text from the environment
    tools: tuple[str, ...]  # every tool name the agent may call
    context: AgentContext
    last_seq: int  # its latest event (the cause of its next model call)
    card: str  # the role card its context starts with (AgentView.system)
    state: AgentState = AgentState.READY
    turns: int = 0  # ordinary turns taken (summary turns not counted)
    model_calls: int = 0  # every model call (the turn cap counts these)
    pending: list[str] = dataclasses.field(default_factory=list)  # next observation's lines
    plan_mode: bool = False
    waiting: bool = False  # called wait_for_messages this turn
    summary_turn: bool = False  # the current turn writes a compaction summary
    stash: str | None = None  # the observation held back during a summary turn
    restart_summary: str | None = None  # the summary, until the next turn's observation
    last_report: dict | None = None  # its latest report_to_ceo (pinned as commitments)
    stats: AgentStats = dataclasses.field(default_factory=AgentStats)
    work: Work | None = None  # its turn from boundary to last tool call (clock scheduler)
    wake_at: float | None = None  # woken: the waking message's send time (its next boundary)
    # (trace length, seq of the agent's latest event when the trace reached it), in order: when
    # each part of the trace came to exist, for `read_trace` (latency.py).
    trace_marks: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state in (AgentState.READY, AgentState.PARKED)

    def mark_trace(self) -> None:
        """Records that the trace has its current length as of event `last_seq`."""
        n = len(self.context.trace)
        if not self.trace_marks or self.trace_marks[-1][0] < n:
            self.trace_marks.append((n, self.last_seq))

    def trace_seq(self, end: int) -> int:
        """The event at which the trace first held `end` tokens."""
        i = bisect.bisect_left(self.trace_marks, (end, -1))
        if i == len(self.trace_marks):
            raise ValueError(f"agent {self.id}'s trace never held {end} tokens")
        return self.trace_marks[i][1]
