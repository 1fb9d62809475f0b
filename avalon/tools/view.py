"""The episode viewer: one rollout's event log as a self-contained HTML page.

    python -m avalon.tools.view EVENTS.jsonl --out=episode.html

Agents are lanes on the derived clock, messages arrows from send to delivery, model and tool
calls bars, hires, fires, compactions and rewards marks; click anything for its text
(`avalon/analysis/episode.py`).
"""

from __future__ import annotations

import argparse
import os

from avalon.analysis.episode import render_episode
from avalon.org.events import read_jsonl


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", help="an event log (JSONL) written by the organisation")
    parser.add_argument("--out", default="episode.html", help="the HTML file to write")
    args = parser.parse_args(argv)
    events = read_jsonl(args.events)
    if not events:
        raise SystemExit(f"{args.events}: no events")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(render_episode(events, title=os.path.basename(args.events)))
    print(args.out)


if __name__ == "__main__":
    main()
