"""An event log file as the tools read it (`view`, `latency`): every problem is a one-line
`Stop` naming the file and the line, never a traceback out of `json` or the replay."""

from __future__ import annotations

import json
import os

from avalon.command import Stop

REQUIRED = ("seq", "agent", "kind")  # what every event of `avalon/org/events.py` carries
WHAT = "an event log is one JSON event per line, as a run writes under WORKDIR/events/"


def load(path: str) -> list[dict]:
    """The events of `path` (a rollout's JSONL log)."""
    if os.path.isdir(path):
        raise Stop(f"{path}: is a directory; give one rollout's .jsonl file in it")
    if os.path.basename(path).startswith("index") and os.path.isfile(path):
        raise Stop(f"{path}: is a step's index of rollouts; give one rollout's file beside it")
    events = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as e:
                    raise Stop(f"{path}: line {n} is not JSON ({e.msg}); {WHAT}") from None
                if not isinstance(event, dict) or any(k not in event for k in REQUIRED):
                    raise Stop(f"{path}: line {n} is not an event (no "
                               f"{'/'.join(REQUIRED)}); {WHAT}")
                events.append(event)
    except UnicodeDecodeError:
        raise Stop(f"{path}: not a text file; {WHAT}") from None
    if not events:
        raise Stop(f"{path}: no events; {WHAT}")
    return events
