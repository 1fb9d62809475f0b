"""Derived latency of one rollout's event log (SPEC §2).

    python -m avalon.tools.latency EVENTS.jsonl

prints JSON: task_latency_s, clocks_s (per agent), critical_token_share, critical_path (event
seqs), critical_tokens, total_tokens, critical_time_s (per agent). A file that is not an event
log ends with one line naming it (`avalon/command.py`).
"""

from __future__ import annotations

import json

from avalon import command
from avalon.org.latency import replay
from avalon.tools import event_log

PROG = "avalon.tools.latency"


def main(argv: list[str] | None = None) -> None:
    parser = command.ArgumentParser(prog=f"python -m {PROG}",
                                    description=__doc__.splitlines()[0])
    parser.add_argument("events", help="an event log (JSONL) written by the organisation")
    args = parser.parse_args(argv)
    print(json.dumps(replay(event_log.load(args.events)).to_json(), indent=2, sort_keys=True))


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; nothing was written")
