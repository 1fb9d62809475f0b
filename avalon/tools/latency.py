"""Derived latency of one rollout's event log (SPEC §2).

    python -m avalon.tools.latency EVENTS.jsonl

prints JSON: task_latency_s, clocks_s (per agent), critical_token_share, critical_path (event
seqs), critical_tokens, total_tokens, critical_time_s (per agent).
"""

from __future__ import annotations

import argparse
import json

from avalon.org.events import read_jsonl
from avalon.org.latency import replay


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", help="an event log (JSONL) written by the organisation")
    args = parser.parse_args(argv)
    print(json.dumps(replay(read_jsonl(args.events)).to_json(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
