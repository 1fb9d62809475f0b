"""The run report: RUN_DIR/report/report.json, PNG plots and a self-contained index.html.

    python -m avalon.analyze RUN_DIR [RUN_DIR ...]      # avalon/analyze.py

From the run's logged rollouts (`logs.read_run`), labelled by a judge (the rule judge unless
given one) and measured (`metrics.py`):
- `checkpoints`: per phase ("eval", "rl") and step, per arm, `metrics.aggregate`.
- `comparisons`: per evaluation step and environment, the organisation against the single
  agent, paired by task (each task's mean reward over its seeds): a Wilcoxon signed-rank test,
  sign counts, a paired bootstrap interval of the mean difference, and with two or more
  environments the same over environments.
- `baselines`: every other evaluated arm (S8, best-of-k, clock sweeps, ...) per step: reward
  with an interval, output tokens, latency, and its latency relative to the organisation's on
  the same step (for S8 at matched tokens, the report's "3.9x sooner" is this ratio).
- `best_of_k`: per step, for arms whose rollouts come k per task (`extra.k`): the best-by-score
  reward (the most of the k) and the majority-vote reward (the mean reward of the most common
  final answer's rollouts).
- `curves`: the organisation arm's metrics over evaluation steps (lead, reviewer, verifier
  title shares, teams with a review, help offers, co-ordination time share, latency and
  critical-path token share).
- `runs`: with several run directories, every run's last evaluation per arm side by side (the
  single-agent-RL-at-matched-compute baseline is a run of its own).
- `episodes`: a viewer page per rollout of the last evaluation (up to `episodes`).
- `judge_agreement`: with an audit judge, Cohen's kappa between the two judges per rubric.
"""

from __future__ import annotations

import base64
import collections
import html
import io
import json
import os
from collections.abc import Sequence

import numpy as np

from avalon.analysis.episode import render_episode
from avalon.analysis.judges import Judge, RuleJudge
from avalon.analysis.logs import LoggedRollout, read_run
from avalon.analysis.metrics import (
    RolloutMetrics,
    aggregate,
    agreement,
    judge_rollouts,
    rollout_metrics,
)
from avalon.analysis.stats import bootstrap_mean, paired_bootstrap, sign_test, wilcoxon
from avalon.org.events import EventKind
from avalon.org.tools import OrgTool

ORG, SINGLE = "org", "single"
_ORG_TOOLS = frozenset(t.value for t in OrgTool)
CURVES = ("lead_title_share", "reviewer_title_share", "verifier_title_share",
          "teams_with_review", "teams_with_help_offer", "coordination_time_share",
          "critical_token_share", "latency_s")


def _value(v):
    """A number out of an aggregate entry (Wilson intervals carry their estimate)."""
    if isinstance(v, dict):
        return v.get("estimate")
    return v


def final_answer(events: Sequence[dict]) -> str:
    """The rollout's answer for a vote: the CEO's final message, else its last environment
    call's arguments (as JSON), else ""."""
    calls = [e for e in events if e["kind"] == EventKind.TOOL_CALL.value and e["agent"] == "ceo"
             and not e["error"] and e.get("args") is not None]
    for e in reversed(calls):
        if e["tool"] == OrgTool.FINAL_MESSAGE.value:
            return str(e["args"].get("text", "")).strip()
    for e in reversed(calls):
        if e["tool"] not in _ORG_TOOLS:
            return json.dumps(e["args"], sort_keys=True)
    return ""


def best_of_k(rollouts: Sequence[LoggedRollout]) -> dict:
    """Best-by-score and majority-vote rewards over groups of k rollouts of one task."""
    by_task: dict[str, list[LoggedRollout]] = collections.defaultdict(list)
    for r in rollouts:
        by_task[r.task_id].append(r)
    best, vote = [], []
    for rs in by_task.values():
        rewards = [r.reward for r in rs]
        best.append(max(rewards))
        answers = [final_answer(r.events) for r in rs]
        counts = collections.Counter(answers)
        top = max(counts.values())
        winner = next(a for a in answers if counts[a] == top)  # ties: the first seen
        vote.append(float(np.mean([w for w, a in zip(rewards, answers) if a == winner])))
    return {"tasks": len(by_task), "k": max(len(v) for v in by_task.values()),
            "best": bootstrap_mean(best).to_json(), "vote": bootstrap_mean(vote).to_json()}


def _paired(org: dict[str, float], single: dict[str, float]) -> dict | None:
    keys = sorted(set(org) & set(single))
    if not keys:
        return None
    x = [org[k] for k in keys]
    y = [single[k] for k in keys]
    return {"pairs": len(keys), "wilcoxon": wilcoxon(x, y).to_json(),
            "sign": sign_test(x, y).to_json(),
            "mean_difference": paired_bootstrap(x, y).to_json()}


def _task_means(rs: Sequence[LoggedRollout]) -> dict[str, float]:
    by: dict[str, list[float]] = collections.defaultdict(list)
    for r in rs:
        by[r.task_id].append(r.reward)
    return {k: float(np.mean(v)) for k, v in by.items()}


def _arm_row(rs: Sequence[LoggedRollout], ms: Sequence[RolloutMetrics]) -> dict:
    return {"rollouts": len(rs), "reward": bootstrap_mean([r.reward for r in rs]).to_json(),
            "tokens_out": float(np.mean([m.tokens_out for m in ms])),
            "latency_s": float(np.mean([m.latency_s for m in ms]))}


def analyse(run_dir: str, judge: Judge | None = None, *, audit: Judge | None = None
            ) -> tuple[dict, list[LoggedRollout]]:
    """The report of one run directory as JSON (see the module docstring), and its rollouts.
    With `audit`, a second judge labels the same texts and `judge_agreement` holds Cohen's
    kappa between the two per rubric."""
    rollouts = list(read_run(run_dir))
    logs = [r.events for r in rollouts]
    labels = judge_rollouts(logs, judge or RuleJudge())
    judge_agreement = (agreement(labels, judge_rollouts(logs, audit))
                       if audit is not None else None)
    ms = [rollout_metrics(r.events, lab) for r, lab in zip(rollouts, labels)]
    groups: dict[tuple[str, int, str], list[int]] = collections.defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[(r.phase, r.step, r.arm)].append(i)
    checkpoints = []
    for (phase, step, arm), idx in sorted(groups.items()):
        checkpoints.append({"phase": phase, "step": step, "rl_step": rollouts[idx[0]].rl_step,
                            "arm": arm, **aggregate([ms[i] for i in idx])})
    eval_steps = sorted({r.step for r in rollouts if r.phase == "eval"})
    comparisons, baselines, bok = [], [], []
    for step in eval_steps:
        at = [i for i, r in enumerate(rollouts) if r.phase == "eval" and r.step == step]
        arms = collections.defaultdict(list)
        for i in at:
            arms[rollouts[i].arm].append(i)
        envs = sorted({rollouts[i].env for i in at})
        per_env = {}
        for env in envs:
            org = [rollouts[i] for i in arms.get(ORG, []) if rollouts[i].env == env]
            single = [rollouts[i] for i in arms.get(SINGLE, []) if rollouts[i].env == env]
            if org and single:
                per_env[env] = {"org_reward": bootstrap_mean([r.reward for r in org]).to_json(),
                                "single_reward": bootstrap_mean(
                                    [r.reward for r in single]).to_json(),
                                "over_tasks": _paired(_task_means(org), _task_means(single))}
        over_envs = None
        if len(per_env) >= 2:
            over_envs = _paired({e: v["org_reward"]["estimate"] for e, v in per_env.items()},
                                {e: v["single_reward"]["estimate"] for e, v in per_env.items()})
        comparisons.append({"step": step, "environments": per_env, "over_environments":
                            over_envs})
        org_latency = (float(np.mean([ms[i].latency_s for i in arms[ORG]]))
                       if arms.get(ORG) else None)
        for arm, idx in sorted(arms.items()):
            row = {"step": step, "arm": arm,
                   **_arm_row([rollouts[i] for i in idx], [ms[i] for i in idx])}
            if org_latency:
                row["latency_vs_org"] = row["latency_s"] / org_latency
            baselines.append(row)
            if any("k" in rollouts[i].extra for i in idx):
                bok.append({"step": step, "arm": arm, **best_of_k([rollouts[i] for i in idx])})
    curves: dict[str, list] = {c: [] for c in CURVES}
    for c in checkpoints:
        if c["phase"] == "eval" and c["arm"] == ORG:
            for name in CURVES:
                curves[name].append([c["step"], _value(c[name])])
    last = eval_steps[-1] if eval_steps else None
    summary = {}
    summary_path = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    report = {"run": os.path.abspath(run_dir), "rollouts": len(rollouts),
              "summary": summary, "checkpoints": checkpoints, "comparisons": comparisons,
              "baselines": baselines, "best_of_k": bok, "curves": curves,
              "last_eval_step": last, "judge_agreement": judge_agreement, "per_rollout": [
                  {"path": os.path.relpath(r.path, run_dir), "phase": r.phase, "step": r.step,
                   "env": r.env, "arm": r.arm, "task_id": r.task_id, **m.to_json()}
                  for r, m in zip(rollouts, ms)]}
    return report, rollouts


# ----- plots and HTML ----------------------------------------------------------------------

def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=72)
    return buf.getvalue()


def plots(report: dict) -> dict[str, bytes]:
    """PNG bytes per plot name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    rows = [b for b in report["baselines"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm in sorted({b["arm"] for b in rows}):
        pts = [b for b in rows if b["arm"] == arm]
        xs = [b["step"] for b in pts]
        ys = [b["reward"]["estimate"] for b in pts]
        err = [[y - b["reward"]["low"] for y, b in zip(ys, pts)],
               [b["reward"]["high"] - y for y, b in zip(ys, pts)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel("collective reward (95% CI)")
    ax.set_title("held-out reward by arm")
    if rows:
        ax.legend()
    out["rewards"] = _png(fig)
    plt.close(fig)

    fig, axes = plt.subplots(2, 4, figsize=(12, 5))
    for ax, name in zip(axes.flat, CURVES):
        pts = [(s, v) for s, v in report["curves"][name] if v is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle("organisation metrics over checkpoints (org arm, held-out)")
    out["org_metrics"] = _png(fig)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    for arm in sorted({b["arm"] for b in rows}):
        pts = [b for b in rows if b["arm"] == arm]
        a1.plot([b["step"] for b in pts], [b["latency_s"] for b in pts], marker="o", label=arm)
        a2.plot([b["step"] for b in pts], [b["tokens_out"] for b in pts], marker="o", label=arm)
    a1.set_title("derived latency (s)")
    a2.set_title("output tokens per rollout")
    for a in (a1, a2):
        a.set_xlabel("step")
        if rows:
            a.legend()
    out["latency"] = _png(fig)
    plt.close(fig)
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict) and "estimate" in v:
        return f"{v['estimate']:.3g} [{v['low']:.3g}, {v['high']:.3g}]"
    if isinstance(v, float):
        return f"{v:.3g}"
    return html.escape(str(v))


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def index_html(report: dict, images: dict[str, bytes], episodes: Sequence[tuple[str, str]],
               runs: Sequence[dict]) -> str:
    parts = [f"<h1>Run report</h1><p>{html.escape(report['run'])}: {report['rollouts']} logged "
             "rollouts</p>"]
    comp_rows = []
    for c in report["comparisons"]:
        for env, v in c["environments"].items():
            t = v["over_tasks"] or {}
            w = t.get("wilcoxon", {})
            comp_rows.append([c["step"], env, v["org_reward"], v["single_reward"],
                              t.get("mean_difference"), t.get("pairs"),
                              f"{w.get('n_up', '-')}/{w.get('n_down', '-')}/"
                              f"{w.get('n_ties', '-')}", w.get("p_value")])
    parts.append("<h2>Organisation vs single agent (held-out)</h2>" + _table(
        ["step", "env", "org reward", "single reward", "org - single", "tasks",
         "up/down/ties", "Wilcoxon p"], comp_rows))
    parts.append("<h2>Arms and baselines</h2>" + _table(
        ["step", "arm", "rollouts", "reward", "output tokens", "latency s", "latency / org"],
        [[b["step"], b["arm"], b["rollouts"], b["reward"], b["tokens_out"], b["latency_s"],
          b.get("latency_vs_org")] for b in report["baselines"]]))
    if report["best_of_k"]:
        parts.append("<h2>Best-of-k</h2>" + _table(
            ["step", "arm", "tasks", "k", "best by score", "majority vote"],
            [[b["step"], b["arm"], b["tasks"], b["k"], b["best"], b["vote"]]
             for b in report["best_of_k"]]))
    if runs:
        parts.append("<h2>Runs (last evaluation)</h2>" + _table(
            ["run", "step", "arm", "reward", "output tokens", "latency s"],
            [[r["run"], r["step"], r["arm"], r["reward"], r["tokens_out"], r["latency_s"]]
             for r in runs]))
    org_rows = [[c["step"], c["arm"], c["hires_per_rollout"], c["lead_title_share"],
                 c["reviewer_title_share"], c["verifier_title_share"], c["teams_with_review"],
                 c["review_tokens_per_org_hour"], c["teams_with_help_offer"],
                 c["coordination_time_share"], c["critical_token_share"],
                 c["opening_plan_component"], c["opening_plan_pipeline"]]
                for c in report["checkpoints"] if c["phase"] == "eval"]
    parts.append("<h2>Organisation metrics per checkpoint</h2>" + _table(
        ["step", "arm", "hires", "lead", "reviewer", "verifier", "teams w/ review",
         "review tok/org-h", "help offers", "coord. time", "crit. tokens", "plan: component",
         "plan: pipeline"], org_rows))
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{html.escape(name)}</h2><img alt=\"{html.escape(name)}\" "
                     f"src=\"data:image/png;base64,{data}\">")
    if episodes:
        items = "".join(f"<li><a href=\"{html.escape(href)}\">{html.escape(label)}</a></li>"
                        for label, href in episodes)
        parts.append(f"<h2>Episodes (last evaluation)</h2><ul>{items}</ul>")
    style = ("body{font:14px sans-serif;margin:16px}table{border-collapse:collapse;"
             "margin-bottom:12px}td,th{border:1px solid #bbb;padding:3px 6px;font-size:12px}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Avalon run report"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def last_eval_rows(report: dict, name: str) -> list[dict]:
    step = report["last_eval_step"]
    return [{"run": name, **{k: b[k] for k in ("step", "arm", "reward", "tokens_out",
                                                 "latency_s")}}
            for b in report["baselines"] if b["step"] == step]


def write_report(run_dir: str, *, judge: Judge | None = None, audit: Judge | None = None,
                 others: Sequence[str] = (), episodes: int = 8) -> str:
    """Analyses `run_dir` (and, for the runs table, `others`) and writes RUN_DIR/report/.
    Returns the report directory."""
    report, rollouts = analyse(run_dir, judge, audit=audit)
    out = os.path.join(run_dir, "report")
    os.makedirs(os.path.join(out, "episodes"), exist_ok=True)
    runs = []
    if others:
        runs += last_eval_rows(report, os.path.basename(os.path.abspath(run_dir)))
        for other in others:
            rep, _ = analyse(other, judge)
            runs += last_eval_rows(rep, os.path.basename(os.path.abspath(other)))
    report["runs"] = runs
    links = []
    last = [r for r in rollouts if r.phase == "eval" and r.step == report["last_eval_step"]]
    for r in last[:episodes]:
        name = f"{r.phase}_step{r.step}_{os.path.splitext(os.path.basename(r.path))[0]}.html"
        with open(os.path.join(out, "episodes", name), "w", encoding="utf-8") as f:
            f.write(render_episode(r.events, title=f"{r.arm} {r.env} {r.task_id} "
                                                   f"({os.path.basename(r.path)})"))
        links.append((f"{r.arm} · {r.env} · {r.task_id} · reward {r.reward:g}",
                      f"episodes/{name}"))
    report["episodes"] = [href for _, href in links]
    pages = {os.path.relpath(r.path, run_dir): href for r, (_, href) in zip(last, links)}
    for row in report["per_rollout"]:
        row["episode"] = pages.get(row["path"])  # the viewer page, where one was written
    images = plots(report)
    for name, png in images.items():
        with open(os.path.join(out, f"{name}.png"), "wb") as f:
            f.write(png)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(index_html(report, images, links, runs))
    return out
