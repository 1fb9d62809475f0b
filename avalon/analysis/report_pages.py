"""The run report's PNG plots and its self-contained index.html (`report.py` makes the JSON).

Every plot's x axis is the RLCR step the checkpoint was played at (0 = after SFT), with integer
ticks. Every curve carries its 95% interval (a band and error bars: Wilson for shares of counted
things, bootstrap over rollouts for the rest, as `metrics.estimate` gives them). A panel with
nothing to draw says so in words (a measure that is n/a at every evaluation, e.g. review
quality in a run without ground truth) instead of drawing empty axes. In tables "n/a" marks a
measure with nothing to count (a team measure for the single agent). Every panel's title and
every table of measures says what the measure counts: actions (what the harness or the
environment recorded) or messages (what agents wrote), `metrics.Measure.basis`.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Sequence

from avalon.analysis.metrics import BASES, MEASURES, measure
from avalon.analysis.report_timing import ROLLOUT_PARTS, STEP_PARTS, UNACCOUNTED

ORG_PANELS = ("hires_per_rollout", "lead_title_share", "reviewer_title_share",
              "verifier_title_share", "messages_per_agent", "teams_with_help_offer",
              "coordination_time_share", "critical_token_share", "latency_s",
              "teams_with_review_message", "review_message_tokens_per_org_hour",
              "opening_plan_pipeline")
# Reviews as the environment recorded them (first six), then as messages (last six).
REVIEW_PANELS = ("teams_with_review", "reviews_per_team", "defects_found_per_team",
                 "reviewed_ship_share", "shipped_per_rollout", "shipped_defects_per_rollout",
                 "teams_with_review_message", "review_messages_per_team",
                 "review_message_precision", "review_message_recall", "rubber_stamp_share",
                 "rubber_stamps_per_team")
FAILED_PANELS = ("failed_calls_per_rollout", "failed_call_share", "failed_calls_ceo",
                 "failed_calls_per_specialist")
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
    ax.set_title(f"{name} [{measure(name).basis}]", fontsize=8)
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

    for name, panels, shape, title in (
            ("org_metrics", ORG_PANELS, (3, 4), "held-out evaluations, 95% intervals"),
            ("review_quality", REVIEW_PANELS, (3, 4),
             "reviews the environment ran [actions] and messages that read as reviews "
             "[messages], 95% intervals"),
            ("failed_calls", FAILED_PANELS, (1, 4),
             "failed tool calls (a tool error), held-out, 95% intervals")):
        fig, axes = plt.subplots(*shape, figsize=(3.2 * shape[1], 2.6 * shape[0] + 0.4))
        for ax, panel in zip(axes.flat, panels):
            _curve_panel(ax, panel, report["curves"])
        fig.suptitle(title)
        out[name] = _png(fig)
        plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    _arm_panel(a1, rows, "latency_s", "derived latency", "seconds (95% CI)")
    _arm_panel(a2, rows, "tokens_out", "output tokens per rollout", "tokens (95% CI)")
    out["latency"] = _png(fig)
    plt.close(fig)
    steps = (report.get("timing") or {}).get("steps") or []
    if any("time/step_s" in s for s in steps):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        _time_panel(a1, steps, (*STEP_PARTS, UNACCOUNTED), "an RLCR step's wall time")
        _time_panel(a2, steps, ROLLOUT_PARTS, "its rollouts' time")
        out["timing"] = _png(fig)
        plt.close(fig)
    return out


def _time_panel(ax, steps: Sequence[dict], parts: Sequence[str], title: str) -> None:
    """Stacked bars per RLCR step of the `parts` a step's line has (a part no line has is
    left out; a panel with none says so)."""
    ax.set_title(title, fontsize=10)
    parts = [p for p in parts if any(p in s for s in steps)]
    if not parts:
        _say(ax, "no line of metrics.jsonl has these fields (written by newer code)")
        return
    xs = [s["rl_step"] for s in steps]
    bottom = [0.0] * len(steps)
    for p in parts:
        ys = [max(s.get(p, 0.0), 0.0) for s in steps]
        ax.bar(xs, ys, bottom=bottom, label=p.removeprefix("time/"))
        bottom = [b + y for b, y in zip(bottom, ys)]
    _steps_axis(ax, xs)
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)


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
        rows = [[r["measure"], r.get("basis") or measure(r["measure"]).basis, r.get("first"),
                 r.get("last"), _change(r)] + ([r["published"] or ""] if arm == "org" else [])
                for r in block["rows"]]
        headers = ["measure", "counts", f"RL {shifts['first_rl_step']}",
                   f"RL {shifts['last_rl_step']}", "change ± SE"] + (
                       ["the published report"] if arm == "org" else [])
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


def shifts_markdown(report: dict) -> str:
    """The shifts tables as Markdown (RUN_DIR/report/shifts.md): per arm, each measure, what
    it counts, its value at the first and the last evaluation, the change with its SE, and
    for the organisation the published report's figure."""
    shifts = report.get("shifts")
    if not shifts:
        return "One evaluation only: nothing to compare.\n"

    def cell(v):
        return "n/a" if v is None else f"{v:.3g}"

    out = [f"Shifts from RL step {shifts['first_rl_step']} to {shifts['last_rl_step']}, at "
           f"{report.get('code') or 'an unrecorded commit'} (`python -m avalon.analyze`; "
           f"messages labelled by {report.get('judge') or 'the rule judge'})."]
    for arm, block in shifts["arms"].items():
        org = arm == "org"
        out += ["", f"{arm} ({block['pairs']} pairs):", "",
                "| measure | counts | RL " + str(shifts["first_rl_step"]) + " | RL "
                + str(shifts["last_rl_step"]) + " | change ± SE |" + (" published |" if org
                                                                     else ""),
                "| --- | --- | --- | --- | --- |" + (" --- |" if org else "")]
        for r in block["rows"]:
            out.append(f"| {r['measure']} | {r.get('basis') or measure(r['measure']).basis} | "
                       f"{cell(r.get('first'))} | {cell(r.get('last'))} | {_change(r)} |"
                       + (f" {r.get('published') or ''} |" if org else ""))
    return "\n".join(out) + "\n"


def _review_tables(evals: Sequence[dict], records: Sequence[dict]) -> str:
    """Reviews the environment ran (its end record), its records summed, and the messages
    that read as reviews, per evaluation."""
    done = _table(["RL step", "arm", "teams w/ review", "reviews / team", "own-work share",
                   "defects found / team", "ships reviewed first", "shipped / rollout",
                   "shipped defects / rollout", "shipped defect share"],
                  [[c["rl_step"], c["arm"], c["teams_with_review"], c["reviews_per_team"],
                    c["self_review_share"], c["defects_found_per_team"],
                    c["reviewed_ship_share"], c["shipped_per_rollout"],
                    c["shipped_defects_per_rollout"], c["shipped_defect_share"]]
                   for c in evals])
    fields = sorted({k for r in records for k in r["fields"]})
    summed = _table(["phase", "RL step", "arm", "rollouts", "teams"] + fields,
                    [[r["phase"], r["rl_step"], r["arm"], r["rollouts"], r["teams"]]
                     + [r["fields"][k]["sum"] if k in r["fields"] else None for k in fields]
                     for r in records]) if records else "<p>No end record in these logs.</p>"
    said = _table(["RL step", "arm", "teams w/ review message", "review messages / team",
                   "verdicts / team", "precision", "recall", "rubber-stamp share",
                   "rubber stamps / team"],
                  [[c["rl_step"], c["arm"], c["teams_with_review_message"],
                    c["review_messages_per_team"], c["verdicts_per_team"],
                    c["review_message_precision"], c["review_message_recall"],
                    c["rubber_stamp_share"], c["rubber_stamps_per_team"]] for c in evals])
    return ("<h2>Reviews the environment ran, per evaluation [actions]</h2><p>From each "
            "rollout's end record (n/a where the environment keeps none): a review here is a "
            "review call that ran on a teammate's build.</p>" + done
            + "<h3>The environment's end records, summed</h3>" + summed
            + "<h2>Messages that read as reviews, per evaluation [messages]</h2><p>What "
              "agents wrote, labelled approve or reject by the judge; a verdict is such a "
              "message naming a build, checked against the environment's ground truth. A "
              "message is not a review: only the table above says one ran.</p>" + said)


def _failed_calls_table(rows: Sequence[dict]) -> str:
    """Failed tool calls per role and tool at the first and last evaluation."""
    evals = sorted({r["step"] for r in rows if r["phase"] == "eval"})
    shown = [r for r in rows if r["phase"] == "eval" and r["step"] in (evals[:1] + evals[-1:])]
    if not shown:
        return "<h2>Failed tool calls [actions]</h2><p>No tool call in the evaluations.</p>"
    return ("<h2>Failed tool calls per role and tool [actions]</h2><p>First and last "
            "evaluation (every checkpoint in report.json); the error is the commonest text "
            "of the tool's failed calls, any role's.</p>"
            + _table(["RL step", "arm", "role", "tool", "calls", "failed", "failed share",
                      "commonest error"],
                     [[r["rl_step"], r["arm"], r["role"], r["tool"], r["calls"], r["failed"],
                       r["share"], f"{r['error']} (x{r['error_count']})" if r["error"] else ""]
                      for r in shown]))


def _timing_table(timing: dict) -> str:
    rows = timing.get("rows") or []
    if not rows:
        return "<h2>Timing</h2><p>No timed line in metrics.jsonl.</p>"
    return ("<h2>Timing (metrics.jsonl)</h2><p>Mean over the lines after each phase's first "
            "(which compiles), beside the first; <code>unaccounted_s</code> is an RLCR step's "
            "wall time in none of rollout, build, update and switch.</p>"
            + _table(["phase", "field", "lines", "first", "mean", "share of the step"],
                     [[r["phase"], r["field"], r["lines"], r["first"], r["mean"],
                       r["share_of_step"]] for r in rows]))


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
    parts.append("<h2>Organisation measures per evaluation</h2><p>Hires and working time "
                 "count actions; help offers, review messages and plans count messages.</p>"
                 + _table(["RL step", "arm", "hires", "lead", "reviewer", "verifier",
                           "teams w/ review message", "review-message tok/org-h",
                           "help offers", "coord. time", "crit. tokens", "plan: component",
                           "plan: pipeline"],
                          [[c["rl_step"], c["arm"], c["hires_per_rollout"],
                            c["lead_title_share"], c["reviewer_title_share"],
                            c["verifier_title_share"], c["teams_with_review_message"],
                            c["review_message_tokens_per_org_hour"], c["teams_with_help_offer"],
                            c["coordination_time_share"], c["critical_token_share"],
                            c["opening_plan_component"], c["opening_plan_pipeline"]]
                           for c in evals]))
    parts.append(_review_tables(evals, report.get("env_records") or []))
    parts.append(_failed_calls_table(report.get("failed_calls") or []))
    parts.append(_timing_table(report.get("timing") or {}))
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
                 + "<p>What a measure counts: " + "; ".join(
                     f"<b>{html.escape(k)}</b>: {html.escape(v)}" for k, v in BASES.items())
                 + ".</p>" + _table(["measure", "counts", "what counts, over what"],
                                    [[m.name, m.basis, m.doc] for m in MEASURES]))
    style = ("body{font:14px sans-serif;margin:16px;max-width:1400px}table{border-collapse:"
             "collapse;margin-bottom:12px}td,th{border:1px solid #bbb;padding:3px 6px;"
             "font-size:12px}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Avalon run report"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
