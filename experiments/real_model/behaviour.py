"""What a model does in the organisation, per evaluation, environment and arm: tool-call form,
hires and titles, rewards (`avalon/analysis/tool_use.py`), as markdown tables and JSON.

    python -m experiments.real_model.behaviour --run=RUN [--phase=eval] [--json=OUT.json]
    python -m experiments.real_model.behaviour --run=RUN --training

RUN is a training run directory (its `events/`); each held-out evaluation is one block: for the
organisation and the single agent on each environment, well-formed turns (share and 95% Wilson
interval), turns that ran a call, hires per organisation rollout and the titles hired, the
mean reward with its standard error, and per tool the share of attempted calls that were
well-formed and that ran without a tool error. `--training`: one row per RLCR step instead,
from RUN/metrics.jsonl (training rollouts are not logged as events by default): the rollouts'
mean reward and the shaped one its advantages use (less the underhire penalty), turns per
rollout that did not parse and whose call failed, hires, and the step's time.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from avalon import command
from avalon.analysis.logs import read_run
from avalon.analysis.tool_use import tool_use_by_group
from avalon.train.telemetry import read_metrics


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside others that define flags of the same names)."""
    flags.DEFINE_string("run", None, "a training run directory (its events/)", required=True)
    flags.DEFINE_string("phase", "eval", "events phase: eval or rl")
    flags.DEFINE_string("json", "", "also write the summaries as JSON to this file")
    flags.DEFINE_bool("training", False, "one row per RLCR step, from RUN/metrics.jsonl")


FLAGS = flags.FLAGS


def _share(s: dict) -> str:
    if s["share"] is None:
        return "n/a"
    return f"{s['share']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['k']}/{s['n']})"


def _mean(m: dict) -> str:
    if m["mean"] is None:
        return "n/a"
    return f"{m['mean']:.2f}" + ("" if m["se"] is None else f" ± {m['se']:.2f}")


def tables(summaries: dict) -> str:
    """Markdown: one table of arms per step, then each arm's tools."""
    lines: list[str] = []
    for step in sorted({k[1] for k in summaries}):
        lines += [f"### step {step}", "",
                  "| env | arm | rollouts | well-formed turns | turns with a call | hires | "
                  "reward | titles (count) |", "|---|---|---|---|---|---|---|---|"]
        keys = sorted(k for k in summaries if k[1] == step)
        for key in keys:
            s = summaries[key]
            titles = ", ".join(f"{t} ({n})" for t, n in list(s["titles"].items())[:6]) or "-"
            lines.append(f"| {key[2]} | {key[3]} | {s['rollouts']} | "
                         f"{_share(s['well_formed_turns'])} | {_share(s['turns_with_calls'])} | "
                         f"{_mean(s['hires'])} | {_mean(s['reward'])} | {titles} |")
        lines += ["", "| env | arm | tool | attempts | well-formed | ran ok |",
                  "|---|---|---|---|---|---|"]
        for key in keys:
            for tool, t in summaries[key]["tools"].items():
                lines.append(f"| {key[2]} | {key[3]} | {tool} | {t['attempts']} | "
                             f"{_share(t['well_formed'])} | {_share(t['ran_ok'])} |")
        lines.append("")
    return "\n".join(lines)


# (metrics.jsonl key, column, format) of the --training table.
TRAINING_COLUMNS = (
    ("rollouts", "rollouts", "{:.0f}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("batch/reward_mean", "reward less the underhire penalty", "{:.3f}"),
    ("org/malformed_turns", "turns not parsed (a rollout)", "{:.2f}"),
    ("org/tool_error_turns", "turns whose call failed (a rollout)", "{:.2f}"),
    ("org/hires_per_rollout", "hires (a rollout)", "{:.2f}"),
    ("time/step_s", "step s", "{:.0f}"),
)


def training_table(metrics_path: str) -> str:
    """Markdown: one row per RLCR step of a run's metrics.jsonl (the last line of a step, if a
    resume wrote it twice)."""
    rows = {int(m["rl_step"]): m for m in read_metrics(metrics_path) if m.get("phase") == "rl"}
    if not rows:
        raise command.Stop(f"{metrics_path}: no RLCR steps (phase 'rl') in it")
    lines = ["| RLCR step | " + " | ".join(c for _, c, _ in TRAINING_COLUMNS) + " |",
             "|---" * (len(TRAINING_COLUMNS) + 1) + "|"]
    for step, m in sorted(rows.items()):
        cells = [fmt.format(m[k]) if isinstance(m.get(k), (int, float)) else "-"
                 for k, _, fmt in TRAINING_COLUMNS]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if FLAGS.training:
        path = os.path.join(FLAGS.run, "metrics.jsonl")
        if not os.path.isfile(path):
            raise command.Stop(f"--run={FLAGS.run}: no metrics.jsonl in it")
        sys.stdout.write(training_table(path))
        return
    groups = tool_use_by_group(read_run(FLAGS.run, phase=FLAGS.phase))
    if not groups:
        raise command.Stop(f"--run={FLAGS.run}: no {FLAGS.phase} event logs under events/")
    summaries = {k: v.summary() for k, v in groups.items()}
    sys.stdout.write(tables(summaries) + "\n")
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump([{"phase": k[0], "step": k[1], "env": k[2], "arm": k[3], **s}
                       for k, s in sorted(summaries.items())], f, indent=1)


if __name__ == "__main__":
    _define_flags()
    command.run("experiments.real_model.behaviour",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
