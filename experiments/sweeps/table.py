"""One table (CSV and markdown) and one plot over a sweep's runs, read from their run
directories (`summary.json` and `metrics.jsonl`, as `avalon.main` writes them).

Per run: the swept fields, the last evaluation's held-out reward of the organisation and of
the single agent (with their std over evaluation rollouts and their rollout counts) and the
gap between them, what the
evaluated organisation did (hires, messages, reviews, co-ordination share, tokens, derived
latency), the last RLCR step's training reward and hires per rollout, wall time, and a status
(`done`, `running` or unfinished, `missing`, or `failed (rc N)` as the runner recorded).
"""

from __future__ import annotations

import csv
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from avalon.train.telemetry import read_metrics  # noqa: E402
from experiments.sweeps.sweep import Sweep, flag_value, run_name  # noqa: E402

# What the last evaluation's organisation arm did (`org_metrics.rollout_metrics`), and the
# single agent's derived latency beside the organisation's.
EVAL_BEHAVIOUR = ("eval/org/hires_per_rollout", "eval/org/messages_per_agent",
                  "eval/org/teams_with_review", "eval/org/coordination_time_share",
                  "eval/org/tokens_per_rollout", "eval/org/latency_s", "eval/single/latency_s")
RESULTS = ("eval/org_reward", "eval/org_reward/std", "eval/single_reward",
           "eval/single_reward/std", "eval/org_rollouts", "eval/single_rollouts",
           "org_minus_single", *EVAL_BEHAVIOUR, "reward/mean",
           "org/hires_per_rollout", "rl_steps", "wall_s", "status")
STATUS_FILE = "sweep_status.json"  # the runner's record of each run's exit code


def _last(records: list[dict], phase: str) -> dict:
    found = [r for r in records if r.get("phase") == phase]
    return found[-1] if found else {}


def collect(sweep: Sweep, workdir: str) -> list[dict]:
    """One row per run of `sweep` under `workdir`."""
    status = {}
    if os.path.exists(os.path.join(workdir, STATUS_FILE)):
        with open(os.path.join(workdir, STATUS_FILE)) as f:
            status = json.load(f)
    rows = []
    for run in sweep.runs:
        name = run_name(sweep, run)
        d = os.path.join(workdir, name)
        row = {"run": name, **{k: run.get(k) for k in sweep.varying}}
        records = read_metrics(os.path.join(d, "metrics.jsonl"))
        ev, rl = _last(records, "eval"), _last(records, "rl")
        for key in ("eval/org_reward", "eval/org_reward/std", "eval/single_reward",
                    "eval/single_reward/std", "eval/org_rollouts", "eval/single_rollouts"):
            row[key] = ev.get(key)
        if ev.get("eval/org_reward") is not None and ev.get("eval/single_reward") is not None:
            row["org_minus_single"] = ev["eval/org_reward"] - ev["eval/single_reward"]
        else:
            row["org_minus_single"] = None
        for key in EVAL_BEHAVIOUR:
            row[key] = ev.get(key)
        row["reward/mean"] = rl.get("reward/mean")
        row["org/hires_per_rollout"] = rl.get("org/hires_per_rollout")
        row["rl_steps"] = rl.get("rl_step", 0)
        summary_path = os.path.join(d, "summary.json")
        summary = {}
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                summary = json.load(f)
        row["wall_s"] = summary.get("wall_s")
        rc = status.get(name)
        if rc not in (None, 0):
            row["status"] = f"failed (rc {rc})"
        elif summary:
            row["status"] = "done"
        else:
            row["status"] = "unfinished" if records else "missing"
        rows.append(row)
    return rows


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.3f}"
    return flag_value(v)


def write_csv(rows: list[dict], path: str) -> str:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(v) for k, v in r.items()})
    return path


def markdown(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_markdown(rows: list[dict], path: str) -> str:
    with open(path, "w") as f:
        f.write(markdown(rows))
    return path


def _spread(row: dict, key: str, arm: str) -> float | None:
    """The band of an arm's mean: its standard error where the rollout count is logged,
    else the rollouts' std."""
    sd, n = row.get(key + "/std"), row.get(f"eval/{arm}_rollouts")
    if sd is None or not n:
        return sd
    return sd / math.sqrt(n)


def write_plot(sweep: Sweep, rows: list[dict], path: str) -> str:
    """Held-out reward of both arms against the swept field `sweep.x` (bands: +-1 standard
    error of each mean, or +-1 std of the rollouts for runs that did not log their count)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style, arm in (("eval/single_reward", "single agent", "--s", "single"),
                                   ("eval/org_reward", "organisation", "-o", "org")):
        pts = sorted((r[sweep.x], r[key], _spread(r, key, arm)) for r in rows
                     if r.get(key) is not None and isinstance(r[sweep.x], (int, float)))
        if not pts:
            continue
        xs, ys, sd = zip(*pts)
        (h,) = ax.plot(xs, ys, style, label=label)
        if all(s is not None for s in sd):
            ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)],
                            color=h.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel(sweep.x)
    se = all(r.get("eval/org_rollouts") for r in rows if r.get("eval/org_reward") is not None)
    ax.set_ylabel("held-out collective reward (last evaluation)\n"
                  + ("band: +-1 standard error" if se else "band: +-1 std of rollouts"),
                  fontsize=9)
    if all(isinstance(r[sweep.x], int) for r in rows):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{sweep.config}: sweep over {sweep.x}")
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_all(sweep: Sweep, workdir: str) -> list[str]:
    """sweep.csv, sweep.md and sweep.png under `workdir`; returns their paths."""
    rows = collect(sweep, workdir)
    return [write_csv(rows, os.path.join(workdir, "sweep.csv")),
            write_markdown(rows, os.path.join(workdir, "sweep.md")),
            write_plot(sweep, rows, os.path.join(workdir, "sweep.png"))]
