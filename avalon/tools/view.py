"""The episode viewer: one rollout's event log as a self-contained HTML page.

    python -m avalon.tools.view EVENTS.jsonl --out=episode.html

The header tells the outcome: reward, end reason, failed calls, the environment's end record.
Agents are lanes on the derived clock, messages arrows from send to delivery, model and tool
calls bars (failed calls in the error colour, never too thin to see), hires, fires, compactions
and rewards marks; click anything for its text; "fit events" (`#fit=events`) draws idle
stretches as breaks (`avalon/analysis/episode.py`).
"""

from __future__ import annotations

import os

from avalon import command
from avalon.analysis.episode import render_episode
from avalon.tools import event_log

PROG = "avalon.tools.view"


def main(argv: list[str] | None = None) -> None:
    parser = command.ArgumentParser(prog=f"python -m {PROG}",
                                    description=__doc__.splitlines()[0])
    parser.add_argument("events", help="an event log (JSONL) written by the organisation")
    parser.add_argument("--out", default="episode.html", help="the HTML file to write")
    args = parser.parse_args(argv)
    events = event_log.load(args.events)
    page = render_episode(events, title=os.path.basename(args.events))
    if os.path.isdir(args.out):
        raise command.Stop(f"--out={args.out}: is a directory; give the HTML file to write")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    print(args.out)


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; nothing was written")
