"""Does RLCR raise review volume, review quality, or both? Every evaluation of a run, measured.

    python -m experiments.bench.review_quality RUN_DIR [--markdown]

For each held-out evaluation and arm (org, single), the measures of review volume
(`VOLUME`: teams with a review and reviews per team as the environment recorded them, teams
with a review message, review messages and matched verdicts per team) and of review quality
against the environment's ground truth (`QUALITY`: precision and recall of the verdicts in
review messages, the share of approvals that were rubber stamps, rubber stamps per team, review
messages that named no build, shipped defects), each with its 95% interval and standard error
(`metrics.estimate`), and its paired change from the first evaluation (`metrics.shift`: the
rollouts with the same environment, task and seed index, the SE of the difference with the
rollout as unit). Every number is a measure of `avalon/analysis/metrics.py` under the rule
judge, so it is the training loop's `eval/<arm>/<name>` and the report's checkpoint value on
the same rollouts. n/a: nothing to count (no team for the single agent; no ground truth outside
collective verification; no reject verdict for precision). Prints JSON; `--markdown` adds the
two tables RESULTS.md quotes.
"""

from __future__ import annotations

import argparse
import json

from avalon.analysis.metrics import estimate, measure, shift
from avalon.analysis.report import paired_rollouts
from experiments.bench.toy_gain import ARMS, evaluations

VOLUME = ("teams_with_review", "reviews_per_team", "teams_with_review_message",
          "review_messages_per_team", "verdicts_per_team")
QUALITY = ("review_message_precision", "review_message_recall", "rubber_stamp_share",
           "rubber_stamps_per_team",
           "unmatched_review_share", "shipped_defects_per_rollout", "shipped_defect_share")
MEASURES = VOLUME + QUALITY


def review_quality(workdir: str) -> dict:
    """{"run", "first_step", "rows": one per (evaluation, arm, measure) with `estimate` (None:
    n/a) and `shift` from the first evaluation (None at the first, or n/a)}."""
    by_step = evaluations(workdir)
    if not by_step:
        raise SystemExit(f"review_quality: {workdir} has no logged evaluation "
                         "(events/eval/step<N>/)")
    steps = sorted(by_step)
    first = steps[0]
    rows = []
    for step in steps:
        for arm in ARMS:
            pairs = by_step[step].get(arm, [])
            if not pairs:
                continue
            ms = [m for _, m in pairs]
            a, b = (paired_rollouts(by_step[first].get(arm, []), pairs) if step != first
                    else ([], []))
            for name in MEASURES:
                rows.append({"step": step, "rl_step": pairs[0][0].rl_step, "arm": arm,
                             "measure": name, "rollouts": len(ms),
                             "estimate": estimate(measure(name), ms),
                             "shift": shift(measure(name), a, b) if a else None})
    return {"run": workdir, "first_step": first, "rows": rows}


def _cell(e: dict | None) -> str:
    if e is None:
        return "n/a"
    text = f"{e['estimate']:.3g} ± {e['se']:.2g}"
    return text + (f" ({e['count']}/{e['of']})" if "count" in e else "")


def _change(s: dict | None) -> str:
    if s is None or s.get("diff") is None:
        return "n/a"
    se = f" ± {s['se']:.2g}" if s.get("se") is not None else ""
    z = f" ({s['z']:+.1f} SE)" if s.get("z") is not None else ""
    return f"{s['diff']:+.3g}{se}{z}"


def markdown(out: dict) -> str:
    """Two tables: each evaluation's estimate ± SE (count/of for a share), and the paired
    change from the first evaluation."""
    keys = sorted({(r["step"], r["arm"]) for r in out["rows"]},
                  key=lambda k: (k[0], ARMS.index(k[1])))
    cell = {(r["step"], r["arm"], r["measure"]): r for r in out["rows"]}
    head = "| RL step | arm | rollouts | " + " | ".join(MEASURES) + " |"
    rule = "| " + " | ".join(["---"] * (3 + len(MEASURES))) + " |"
    lines = [head, rule]
    for step, arm in keys:
        r0 = cell[(step, arm, MEASURES[0])]
        lines.append(f"| {r0['rl_step']} | {arm} | {r0['rollouts']} | "
                     + " | ".join(_cell(cell[(step, arm, n)]["estimate"]) for n in MEASURES)
                     + " |")
    later = [k for k in keys if k[0] != out["first_step"]]
    if later:
        lines += ["", "Paired change from the first evaluation (last - first ± SE):", "",
                  head.replace("rollouts", "pairs"), rule]
        for step, arm in later:
            r0 = cell[(step, arm, MEASURES[0])]
            pairs = next((cell[(step, arm, n)]["shift"]["n"] for n in MEASURES
                          if cell[(step, arm, n)]["shift"] is not None), 0)
            lines.append(f"| {r0['rl_step']} | {arm} | {pairs} | "
                         + " | ".join(_change(cell[(step, arm, n)]["shift"])
                                      for n in MEASURES) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    out = review_quality(args.run)
    print(json.dumps(out, indent=1))
    if args.markdown:
        print(markdown(out))


if __name__ == "__main__":
    main()
