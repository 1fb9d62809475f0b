"""Clock-ordered scheduling: which agents act next, and in which order effects commit.

The simulator's time is the derived clock of SPEC §2 (`avalon/org/latency.py`). An agent's turn
is three kinds of items on that clock:
- its *boundary*, at its clock (for an agent woken from `wait_for_messages`, the send time of the
  waking message): its inbox is drained, the observation built, the turn sent to the policy;
- its *model call*, committed at boundary + `model_call_seconds(n_in_new, n_out)` (the output
  joins its context and trace, the `model_call` is logged, its calls are parsed);
- each of its *tool calls*, committed at the clock at which the call starts (its agent's clock
  after the model call and the calls before it). Everything a call changes (environment state,
  sends, posts, archive notes, files, hires, fires) happens at that commit.

`Organisation.begin_tick` commits items in clock order until the earliest item is a boundary,
then hands the policy one batch: every idle ready agent whose boundary lies within
`OrgConfig.schedule_horizon_s` of the earliest boundary (strictly within, or at it) and before
the next pending effect. With the default horizon, the shortest possible model call (one
sampled token), no effect of a batch can precede another member's boundary, so every turn sees
the state at its clock: nothing of the future, everything of the past. A message is therefore
delivered at the receiver's first boundary at or after its send time, and a parked receiver
wakes at the send time.

Ties are broken by a documented key, so logs stay byte-identical for the same seed and
outputs: `(clock time, item kind, agent index)`, where effects (model-call and tool-call
commits) come before boundaries at the same time (a boundary at t sees what happened at t), and
agent index is hire order (the CEO is 0).

`schedule_horizon_s = inf` is the old lock-step tick, kept for comparison in a module of its own
(`avalon/org/lockstep.py`): every ready agent acts each tick, and outputs are applied agent by
agent in listing order, calls at once.
"""

from __future__ import annotations

import dataclasses
import math

from avalon.org.latency import MIN_MODEL_CALL_S, ClockReplay
from avalon.org.policy import Turn, TurnOutput
from avalon.org.toolcall import Call, ParsedTurn

__all__ = ["MIN_MODEL_CALL_S", "Scheduled", "Work", "pick_batch", "verify_schedule"]

@dataclasses.dataclass
class Work:
    """An agent's turn between its boundary and the end of its last tool call."""

    turn: Turn
    start_s: float  # the clock at the boundary
    out: TurnOutput | None = None  # the policy's output (set by `Organisation.apply`)
    done_s: float = math.nan  # start_s + the model call's seconds
    mc: int | None = None  # the model_call's seq, once committed
    parsed: ParsedTurn | None = None
    calls: list[Call] = dataclasses.field(default_factory=list)  # not yet committed
    failed: bool = False  # a committed call of this turn was a tool error


@dataclasses.dataclass(frozen=True)
class Scheduled:
    """What the scheduler charged an event: for the one-source-of-truth check against
    `latency.replay` (the agent's clock right before the event must be `start_s`; for a model
    call, right after it `end_s`) and for the clock order of commits (`at_s`, non-decreasing
    over the log when the horizon is the default)."""

    seq: int
    start_s: float
    end_s: float
    at_s: float


def pick_batch(ready: list[tuple[float, int]], next_effect_s: float, horizon_s: float
               ) -> list[int]:
    """Of the idle ready agents, given as (boundary time, agent index), the indices that go to
    the policy together: the earliest, and those strictly within `horizon_s` of it and strictly
    before the next pending effect. The earliest must lie before that effect."""
    t0 = min(t for t, _ in ready)
    if t0 >= next_effect_s:
        raise ValueError(f"pick_batch: earliest boundary {t0} is not before the next effect "
                         f"{next_effect_s}")
    return sorted(i for t, i in ready
                  if t == t0 or (t < t0 + horizon_s and t < next_effect_s))


def verify_schedule(events, scheduled: list[Scheduled], *, clock_order: bool) -> None:
    """Checks that the clocks the scheduler used are `latency.py`'s replay of the log: before
    every scheduled event its agent's replayed clock is `start_s`, after a model call `end_s`;
    with `clock_order`, commit times never go back. A mismatch is a simulator bug (ValueError).
    """
    replay = ClockReplay()
    by_seq = {s.seq: s for s in scheduled}
    last_at = -math.inf
    for e in events:
        s = by_seq.get(e["seq"])
        before = replay.clock(e["agent"])
        replay.apply(e)
        if s is None:
            continue
        if before != s.start_s:
            raise ValueError(f"event seq {s.seq} ({e['kind']}, {e['agent']}): the scheduler "
                             f"started it at {s.start_s!r}, the replay at {before!r}")
        if e["kind"] == "model_call" and replay.clock_at(s.seq) != s.end_s:
            raise ValueError(f"event seq {s.seq} (model_call, {e['agent']}): the scheduler "
                             f"ended it at {s.end_s!r}, the replay at {replay.clock_at(s.seq)!r}")
        if clock_order and s.at_s < last_at:
            raise ValueError(f"event seq {s.seq} committed at {s.at_s!r}, after a commit at "
                             f"{last_at!r}")
        last_at = max(last_at, s.at_s)
    missing = set(by_seq) - {e["seq"] for e in events}
    if missing:
        raise ValueError(f"scheduled events {sorted(missing)} are not in the log")
