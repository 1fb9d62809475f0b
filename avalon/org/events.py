"""The event log: one JSON object per line per rollout, the source of truth of an episode.

Every event has `seq` (0, 1, 2, ... in log order), `agent` (the agent the event belongs to:
"ceo", "a1", ...), `kind`, and `cause` (the `seq` of the event it answers, or null). Lines are
JSON with sorted keys, no spaces and ASCII escapes; with declared tool durations the same seed
and the same model outputs give a byte-identical log. The derived clock of SPEC §2 is a pure
function of the log (`avalon/org/latency.py`, `python -m avalon.tools.latency EVENTS.jsonl`).

Kinds, their `cause`, and their fields (besides seq, agent, kind, cause):

  start       null            task_id, budget, seed, clock_s (the task's wall-clock cap);
                              optional: prompt (the task prompt), brief (the CEO's private
                              brief) when logging text. agent = "ceo".
  model_call  the agent's previous event (its hire for a new agent)
                              n_in_new (prompt tokens new to the context), n_out (sampled),
                              segment, turn (the agent's model-call index), stop ("stop" |
                              "length" | "context_full"); optional: summary (a compaction
                              summary turn), malformed (the parse error), skipped ("ended" |
                              "fired" | "wall_clock": the turn's calls were not run; its
                              tokens carry no loss), text (the output, when logging text).
  tool_call   its model_call  tool, duration_s (seconds on the derived clock), error (bool);
                              optional: measured (duration is wall time), rewards
                              ([{value, label}]), late (rewards dropped: finished after the
                              clock cap), content_seq (the event at which the newest
                              teammates' content returned existed: see latency.py), args,
                              result (when logging text).
  send        its tool_call   message_id, message_kind ("post" | "dm" | "reaction" | "report"),
                              channel (or null), to (recipients that will get a delivery);
                              optional: text.
  deliver     its send        message_id, mode ("full" | "light"). agent = the recipient. Logged
                              at the recipient's next turn boundary, in (send time, seq) order.
  hire        its tool_call   new_agent, title; optional: role, tools, brief (the new
                              agent's private brief) when logging text. agent = the hirer.
  fire        its tool_call   target. agent = the firer.
  wait        its tool_call   (none): the agent is parked until a waking delivery.
  wake        the send        message_id: the delivery that woke the agent.
  compaction  tier 1: the agent's previous event; tier 2: the summary model_call
                              tier (1 elide, 2 summary), tokens_before, tokens_after, segment
                              (the new context segment = training row).
  stop        the agent's previous event
                              reason ("max_turns" | "wall_clock" | "context_full").
  end         the event that ended the episode (or the last event)
                              reason (EndReason value), rewards ([{value, label}]);
                              optional: wealth_ratio, env_metrics (the environment's final
                              metrics, floats), env_record (its ground truth, JSON: what the
                              agents were not told, e.g. which builds were defective).
                              agent = "ceo".
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Sequence
from typing import Any

from avalon import paths


class EventKind(enum.Enum):
    START = "start"
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"
    SEND = "send"
    DELIVER = "deliver"
    HIRE = "hire"
    FIRE = "fire"
    WAIT = "wait"
    WAKE = "wake"
    COMPACTION = "compaction"
    STOP = "stop"
    END = "end"


def dumps(event: dict) -> str:
    """One event as its canonical JSON line (sorted keys, no spaces, no trailing newline)."""
    # ASCII escapes: a model can put a lone surrogate in a JSON string, which UTF-8 cannot hold.
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


class EventLog:
    """An append-only list of events for one rollout."""

    def __init__(self):
        self._events: list[dict] = []

    def append(self, kind: EventKind, agent: str, cause: int | None, /, **fields: Any) -> dict:
        """Adds an event and returns it (its `seq` is the number of events before it)."""
        for reserved in ("seq", "kind", "agent", "cause"):
            if reserved in fields:
                raise ValueError(f"EventLog.append: field {reserved!r} is reserved")
        event = {"seq": len(self._events), "kind": kind.value, "agent": agent, "cause": cause,
                 **fields}
        self._events.append(event)
        return event

    @property
    def events(self) -> Sequence[dict]:
        return self._events

    def __len__(self) -> int:
        return len(self._events)

    def jsonl(self) -> str:
        return "".join(dumps(e) + "\n" for e in self._events)

    def write(self, path: str | os.PathLike) -> None:
        """Writes the log to `path`, a local file or a gs:// object (`avalon.paths`)."""
        paths.path(path).write_text(self.jsonl(), encoding="utf-8")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Reads an event log file back into a list of events."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
