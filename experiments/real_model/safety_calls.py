"""How a model's peers reach the safety scenarios' tools: the tool-call form of a safety-suite
run, per checkpoint and scenario, read from the suite's event logs.

    python -m experiments.safety.run ... --out=OUT
    python -m experiments.real_model.safety_calls --out=OUT [--json=FILE]

For each checkpoint (`OUT/logs/<checkpoint>/`) and scenario (the `start` event's task): the
rollouts, the peers' turns, the well-formed share of turns and those that ran a call (Wilson
95%), and per tool the attempts (calls that parsed, plus malformed turns whose text names the
tool), the well-formed share of attempts and the share that ran without a tool error
(`avalon/analysis/tool_use.py`). Confederates' turns are scripted and left out. This says
whether a zero-shot model's text ever gets as far as a decision tool, and if not, where it
stops (no call, a call of another tool, a malformed call).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from absl import app, flags

from avalon import command
from avalon.analysis.logs import read_events
from avalon.analysis.tool_use import ToolUse
from avalon.envs.safety import by_name


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside others that define flags of the same names)."""
    flags.DEFINE_string("out", None, "the --out directory of experiments.safety.run",
                        required=True)
    flags.DEFINE_string("json", "", "also write the summaries as JSON to this file")


FLAGS = flags.FLAGS


def scenario_of(events) -> str:
    task = events[0].get("task_id", "")
    return task.rsplit("-heldout-", 1)[0]


def tool_use(out: str) -> dict[tuple[str, str], ToolUse]:
    """{(checkpoint, scenario): ToolUse over the counted peers' events}."""
    logs = Path(out) / "logs"
    if not logs.is_dir():
        raise command.Stop(f"--out={out}: no logs/ (run experiments.safety.run --out={out})")
    scenarios = {s.name: s for s in by_name("")}
    groups: dict[tuple[str, str], ToolUse] = {}
    for ckpt in sorted(p for p in logs.iterdir() if p.is_dir()):
        for path in sorted(ckpt.glob("group*_rollout*.jsonl")):
            r = read_events(path)
            name = scenario_of(r.events)
            if name not in scenarios:
                raise command.Stop(f"{path}: task {r.events[0].get('task_id')!r} is no "
                                   "scenario of the safety suite")
            counted = set(scenarios[name].counted)
            kept = [e for e in r.events if e["agent"] in counted or e["kind"] == "start"]
            groups.setdefault((ckpt.name, name), ToolUse()).add(
                dataclasses.replace(r, events=kept))
    if not groups:
        raise command.Stop(f"--out={out}: no event logs under logs/")
    return groups


def _share(s: dict) -> str:
    if s["share"] is None:
        return "n/a"
    return f"{s['share']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['k']}/{s['n']})"


def tables(summaries: dict) -> str:
    lines = ["| checkpoint | scenario | rollouts | well-formed turns | turns with a call |",
             "|---|---|---|---|---|"]
    for (ckpt, name), s in summaries.items():
        lines.append(f"| {ckpt} | {name} | {s['rollouts']} | {_share(s['well_formed_turns'])} "
                     f"| {_share(s['turns_with_calls'])} |")
    lines += ["", "| checkpoint | scenario | tool | attempts | well-formed | ran ok |",
              "|---|---|---|---|---|---|"]
    for (ckpt, name), s in summaries.items():
        for tool, t in s["tools"].items():
            lines.append(f"| {ckpt} | {name} | {tool} | {t['attempts']} | "
                         f"{_share(t['well_formed'])} | {_share(t['ran_ok'])} |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    summaries = {k: v.summary() for k, v in tool_use(FLAGS.out).items()}
    sys.stdout.write(tables(summaries))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump([{"checkpoint": k[0], "scenario": k[1], **s}
                       for k, s in summaries.items()], f, indent=1)


if __name__ == "__main__":
    _define_flags()
    command.run("experiments.real_model.safety_calls",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
