"""What RLCR changed in a run: held-out evaluations compared, paired rollout by rollout.

    python -m experiments.bench.toy_gain runs/toyA [runs/toyB ...] [--first=STEP] [--last=STEP]

Reads the evaluation event logs (`WORKDIR/events/eval/step<N>/`, `avalon/analysis/logs.py`).
Evaluations at different steps replay the same held-out tasks with the same seeds, so each
rollout of the last evaluation is paired with the rollout of the first one that has the same
environment, arm, task and seed index (`report.pair_key`); org against single pairs the same
task and seed index at one evaluation. Every quantity is a measure of
`avalon/analysis/metrics.py` (the training loop's and the report's definitions, labelled by the
rule judge as the loop labels them), so `first` and `last` are the loop's `eval/<arm>/<name>`
and the report's checkpoint values when every rollout pairs. For each measure, arm and scope
(all environments, then each): `n` pairs, `first`, `last`, `diff` = last - first, its standard
error `se` (delta method over pairs: for a mean per rollout, sd of the differences / sqrt(n))
and `z` = diff / se (`metrics.shift`); measures that are n/a (a team measure for the single
agent, review quality without ground truth) are left out. Old names: `hires` is
`hires_per_rollout`, `review_share` is `teams_with_review` (`metrics.ALIASES`).
Prints one JSON object per run.
"""

from __future__ import annotations

import argparse
import collections
import json

from avalon.analysis.judges import RuleJudge
from avalon.analysis.logs import read_run
from avalon.analysis.metrics import MEASURES, judge_rollouts, measure, rollout_metrics, shift
from avalon.analysis.report import paired_rollouts

ARMS = ("org", "single")


def evaluations(workdir: str) -> dict[int, dict[str, list]]:
    """step -> arm -> [(rollout, its metrics)] for the org and single arms of every
    evaluation."""
    rollouts = [r for r in read_run(workdir, phase="eval") if r.arm in ARMS]
    labels = judge_rollouts([r.events for r in rollouts], RuleJudge())
    out: dict[int, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(
        list))
    for r, lab in zip(rollouts, labels):
        out[r.step][r.arm].append((r, rollout_metrics(r.events, lab)))
    return out


def compare(workdir: str, first: int | None = None, last: int | None = None) -> dict:
    by_step = evaluations(workdir)
    if len(by_step) < 2:
        raise SystemExit(f"toy_gain: {workdir} has {len(by_step)} evaluation(s); needs 2")
    steps = sorted(by_step)
    s0 = first if first is not None else steps[0]
    s1 = last if last is not None else steps[-1]
    for s in (s0, s1):
        if s not in by_step:
            raise SystemExit(f"toy_gain: {workdir} has no evaluation at step {s}; has {steps}")
    out = {"workdir": workdir, "first_step": s0, "last_step": s1, "rise": {},
           "org_vs_single": {}}
    for arm in ARMS:
        at0, at1 = by_step[s0].get(arm, []), by_step[s1].get(arm, [])
        envs = sorted({r.env for r, _ in at0})
        for scope in ("all", *envs):
            a, b = paired_rollouts([p for p in at0 if scope in ("all", p[0].env)],
                                   [p for p in at1 if scope in ("all", p[0].env)])
            if not a:
                continue
            for m in MEASURES:
                s = shift(m, a, b)
                if s is not None:
                    out["rise"][f"{arm}/{scope}/{m.name}"] = s
    for step, label in ((s0, "first"), (s1, "last")):
        single, org = paired_rollouts(by_step[step].get("single", []),
                                      by_step[step].get("org", []))
        out["org_vs_single"][label] = shift(measure("reward"), single, org) if org else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--first", type=int, default=None)
    p.add_argument("--last", type=int, default=None)
    args = p.parse_args()
    print(json.dumps([compare(w, args.first, args.last) for w in args.runs], indent=1))


if __name__ == "__main__":
    main()
