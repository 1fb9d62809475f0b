"""The run report's PNG plots and its self-contained index.html (`report.py` makes the JSON).

Every plot's x axis is the RLCR step the checkpoint was played at (0 = after SFT), with integer
ticks. Every curve carries its 95% interval (a band and error bars: Wilson for shares of counted
things, bootstrap over rollouts for the rest, as `metrics.estimate` gives them). A panel with
nothing to draw says so in words (a measure that is n/a at every evaluation, e.g. review
quality in a run without ground truth) instead of drawing empty axes. In tables "n/a" marks a
measure with nothing to count (a team measure for the single agent).
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Sequence

from avalon.analysis.metrics import MEASURES, measure

ORG_PANELS = ("hires_per_rollout", "lead_title_share", "reviewer_title_share",
              "verifier_title_share", "messages_per_agent", "teams_with_help_offer",
              "coordination_time_share", "critical_token_share", "latency_s",
              "teams_with_review", "review_tokens_per_org_hour", "opening_plan_pipeline")
REVIEW_PANELS = ("reviews_per_team", "review_precision", "review_recall", "rubber_stamp_share",
                 "rubber_stamps_per_team", "shipped_defects_per_rollout")
_STYLE = {"org": dict(color="tab:blue", marker="o"), "single": dict(color="tab:orange",
                                                                     marker="s")}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=72)
    return buf.getvalue()


def _say(ax, text: str) -> None:
    """A panel with nothing to draw: the reason in words, no axes."""
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.text(0.5, 0.5, textwrap.fill(text, 34), ha="center", va="center", fontsize=8,
            color="0.35", transform=ax.transAxes)


def why_empty(name: str) -> str:
    """Why a measure has no point at any evaluation: nothing its denominator counts."""
    return f"n/a at every evaluation: no {measure(name).over} in these logs"


def _steps_axis(ax, xs: Sequence[int]) -> None:
    """Integer RL-step ticks; one evaluation only: a step either side of it (matplotlib would
    tick a zero-width range in fractions)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if xs and min(xs) == max(xs):
        ax.set_xlim(xs[0] - 1, xs[0] + 1)


def _curve_panel(ax, name: str, curves: dict) -> None:
    series = curves.get(name) or {}
    ax.set_title(name, fontsize=9)
    if not any(series.values()):
        _say(ax, why_empty(name))
        return
    for arm, pts in sorted(series.items()):
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        lo = [p[2] for p in pts]
        hi = [p[3] for p in pts]
        style = _STYLE.get(arm, {})
        ax.fill_between(xs, lo, hi, alpha=0.2, color=style.get("color"), linewidth=0)
        ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]],
                    capsize=2, markersize=4, label=arm, **style)
    _steps_axis(ax, [p[0] for pts in series.values() for p in pts])
    ax.set_xlabel("RL step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)


def _arm_panel(ax, rows: Sequence[dict], key: str, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    rows = [b for b in rows if b.get(key) is not None]
    if not rows:
        _say(ax, "no evaluation logged")
        return
    for arm in sorted({b["arm"] for b in rows}):
        pts = [b for b in rows if b["arm"] == arm]
        xs = [b["rl_step"] for b in pts]
        ys = [b[key]["estimate"] for b in pts]
        err = [[y - b[key]["low"] for y, b in zip(ys, pts)],
               [b[key]["high"] - y for y, b in zip(ys, pts)]]
        ax.errorbar(xs, ys, yerr=err, capsize=3, label=arm,
                    **_STYLE.get(arm, dict(marker="^")))
    _steps_axis(ax, [b["rl_step"] for b in rows])
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def plots(report: dict) -> dict[str, bytes]:
    """PNG bytes per plot name: rewards, org_metrics, review_quality, latency."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    rows = report["baselines"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    _arm_panel(ax, rows, "reward", "held-out reward by arm", "collective reward (95% CI)")
    out["rewards"] = _png(fig)
    plt.close(fig)

    for name, panels, shape in (("org_metrics", ORG_PANELS, (3, 4)),
                                ("review_quality", REVIEW_PANELS, (2, 3))):
        fig, axes = plt.subplots(*shape, figsize=(3.2 * shape[1], 2.6 * shape[0]))
        for ax, panel in zip(axes.flat, panels):
            _curve_panel(ax, panel, report["curves"])
        fig.suptitle("held-out evaluations, 95% intervals" if name == "org_metrics" else
                     "review volume and quality against ground truth, 95% intervals")
        out[name] = _png(fig)
        plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    _arm_panel(a1, rows, "latency_s", "derived latency", "seconds (95% CI)")
    _arm_panel(a2, rows, "tokens_out", "output tokens per rollout", "tokens (95% CI)")
    out["latency"] = _png(fig)
    plt.close(fig)
    return out


# ----- HTML ----------------------------------------------------------------------------------

def fmt(v) -> str:
    """A table cell: n/a for None, an estimate with its interval, a number, or text."""
    if v is None:
        return "n/a"
    if isinstance(v, dict) and "estimate" in v:
        return f"{v['estimate']:.3g} [{v['low']:.3g}, {v['high']:.3g}]"
    if isinstance(v, float):
        return f"{v:.3g}"
    return html.escape(str(v))


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _change(row: dict) -> str:
    if row.get("diff") is None:
        return "n/a"
    se = f" ± {row['se']:.3g}" if row.get("se") is not None else ""
    z = f" ({row['z']:+.1f} SE)" if row.get("z") is not None else ""
    return f"{row['diff']:+.3g}{se}{z}"


def _shift_tables(shifts: dict | None) -> str:
    if not shifts:
        return ("<h2>Shifts</h2><p>One evaluation only: nothing to compare (the shifts need "
                "the first and the last).</p>")
    parts = [f"<h2>Shifts from RL step {shifts['first_rl_step']} to {shifts['last_rl_step']}"
             "</h2><p>Each measure over the rollouts that pair (same environment, task and "
             "seed at both evaluations); change = last - first ± its standard error (delta "
             "method, rollout as unit) and in SEs.</p>"]
    for arm, block in shifts["arms"].items():
        rows = [[r["measure"], r.get("first"), r.get("last"), _change(r)]
                + ([r["published"] or ""] if arm == "org" else [])
                for r in block["rows"]]
        headers = ["measure", f"RL {shifts['first_rl_step']}", f"RL {shifts['last_rl_step']}",
                   "change ± SE"] + (["the published report"] if arm == "org" else [])
        parts.append(f"<h3>{html.escape(arm)} ({block['pairs']} pairs)</h3>"
                     + _table(headers, rows))
    by = shifts["coordination_by_team_size"]
    sizes = sorted(set(by["first"]) | set(by["last"]) | set(by["published"]), key=int)
    parts.append("<h3>Co-ordination share of working time by team size (organisation)</h3>"
                 + _table(["hires", f"RL {shifts['first_rl_step']}",
                           f"RL {shifts['last_rl_step']}", "the published report"],
                          [[s, by["first"].get(s), by["last"].get(s), by["published"].get(s)]
                           for s in sizes]))
    return "".join(parts)


def index_html(report: dict, images: dict[str, bytes], episodes: Sequence[tuple[str, str]],
               runs: Sequence[dict], *, embed_images: bool = True) -> str:
    """The page; with `embed_images` False it shows NAME.png files beside it instead of
    holding the images (a smaller page, e.g. the example under docs/)."""
    parts = [f"<h1>Run report</h1><p>{html.escape(report['run'])}: {report['rollouts']} logged "
             f"rollouts, at {html.escape(report.get('code') or 'an unrecorded commit')}"
             f"</p><h2>What it learnt</h2><p>{html.escape(report['learning'])}</p>"]
    comp_rows = []
    for c in report["comparisons"]:
        for env, v in c["environments"].items():
            t = v["over_tasks"] or {}
            w = t.get("wilcoxon", {})
            comp_rows.append([c["rl_step"], env, v["org_reward"], v["single_reward"],
                              t.get("mean_difference"), t.get("pairs"),
                              f"{w.get('n_up', '-')}/{w.get('n_down', '-')}/"
                              f"{w.get('n_ties', '-')}", w.get("p_value")])
    parts.append("<h2>Organisation vs single agent (held-out)</h2>" + _table(
        ["RL step", "env", "org reward", "single reward", "org - single (tasks)", "tasks",
         "up/down/ties", "Wilcoxon p"], comp_rows))
    paired = [[c["rl_step"], c["paired"]["n"], _change(c["paired"])]
              for c in report["comparisons"] if c.get("paired")]
    if paired:
        parts.append("<p>Paired by task and seed (every environment):</p>" + _table(
            ["RL step", "pairs", "org - single ± SE"], paired))
    parts.append("<h2>Arms and baselines</h2>" + _table(
        ["RL step", "arm", "rollouts", "reward", "output tokens", "latency s", "latency / org"],
        [[b["rl_step"], b["arm"], b["rollouts"], b["reward"], b["tokens_out"], b["latency_s"],
          b.get("latency_vs_org")] for b in report["baselines"]]))
    if report["best_of_k"]:
        parts.append("<h2>Best-of-k</h2>" + _table(
            ["step", "arm", "tasks", "k", "best by score", "majority vote"],
            [[b["step"], b["arm"], b["tasks"], b["k"], b["best"], b["vote"]]
             for b in report["best_of_k"]]))
    if runs:
        parts.append("<h2>Runs (last evaluation)</h2>" + _table(
            ["run", "RL step", "arm", "reward", "output tokens", "latency s"],
            [[r["run"], r["rl_step"], r["arm"], r["reward"], r["tokens_out"], r["latency_s"]]
             for r in runs]))
    parts.append(_shift_tables(report["shifts"]))
    evals = [c for c in report["checkpoints"] if c["phase"] == "eval"]
    parts.append("<h2>Organisation measures per evaluation</h2>" + _table(
        ["RL step", "arm", "hires", "lead", "reviewer", "verifier", "teams w/ review",
         "review tok/org-h", "help offers", "coord. time", "crit. tokens", "plan: component",
         "plan: pipeline"],
        [[c["rl_step"], c["arm"], c["hires_per_rollout"], c["lead_title_share"],
          c["reviewer_title_share"], c["verifier_title_share"], c["teams_with_review"],
          c["review_tokens_per_org_hour"], c["teams_with_help_offer"],
          c["coordination_time_share"], c["critical_token_share"], c["opening_plan_component"],
          c["opening_plan_pipeline"]] for c in evals]))
    parts.append("<h2>Review volume and quality against ground truth, per evaluation</h2>"
                 + _table(["RL step", "arm", "teams w/ review", "reviews / team",
                           "verdicts / team", "precision", "recall", "rubber-stamp share",
                           "rubber stamps / team", "shipped defects / rollout",
                           "shipped defect share"],
                          [[c["rl_step"], c["arm"], c["teams_with_review"],
                            c["reviews_per_team"], c["verdicts_per_team"],
                            c["review_precision"], c["review_recall"],
                            c["rubber_stamp_share"], c["rubber_stamps_per_team"],
                            c["shipped_defects_per_rollout"], c["shipped_defect_share"]]
                           for c in evals]))
    for name, png in images.items():
        src = (f"data:image/png;base64,{base64.b64encode(png).decode('ascii')}"
               if embed_images else f"{html.escape(name)}.png")
        parts.append(f"<h2>{html.escape(name)}</h2><img alt=\"{html.escape(name)}\" "
                     f"src=\"{src}\">")
    if episodes:
        items = "".join(f"<li><a href=\"{html.escape(href)}\">{html.escape(label)}</a></li>"
                        for label, href in episodes)
        parts.append(f"<h2>Episodes (last evaluation)</h2><ul>{items}</ul>")
    parts.append("<h2>Definitions</h2><p>Every number above is one of these measures "
                 "(<code>avalon/analysis/metrics.py</code>; the training loop logs the same "
                 "ones as <code>eval/&lt;arm&gt;/&lt;name&gt;</code>).</p>"
                 + _table(["measure", "what counts, over what"],
                          [[m.name, m.doc] for m in MEASURES]))
    style = ("body{font:14px sans-serif;margin:16px;max-width:1400px}table{border-collapse:"
             "collapse;margin-bottom:12px}td,th{border:1px solid #bbb;padding:3px 6px;"
             "font-size:12px}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Avalon run report"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
