"""Do the training loop, the report and the benchmarks give one number per measure on a run?

    python -m experiments.bench.measure_agreement RUN_DIR [--steps=first,last] [--markdown]

For the first and the last evaluation (or `--steps`), for each arm (org, single) and each
measure of `avalon/analysis/metrics.py`, three numbers on the same held-out rollouts:
- loop: what the training loop logged in RUN_DIR/metrics.jsonl (`eval/<arm>/<name>`; the
  reward as `eval/<arm>_reward`), measured in memory as the rollouts finished;
- report: `avalon.analysis.report.analyse(RUN_DIR)`'s checkpoint estimate, from the logged
  event files (rule judge);
- bench: `experiments.bench.toy_gain.compare`'s `first` / `last` for the arm over all
  environments (paired rollouts; every evaluation rollout pairs when evaluations replay the
  same tasks and seeds).
A row agrees when all three are n/a or all three are numbers equal to 1e-9 (sums in another
order). Prints a JSON summary, and with `--markdown` the table. The loop's numbers are exact
on one process; with several, the loop reduces each metric across processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from avalon.analysis.metrics import MEASURES
from avalon.analysis.report import ARMS, analyse
from avalon.train.telemetry import read_metrics
from experiments.bench.toy_gain import compare

REL = 1e-9


def _loop_key(arm: str, name: str) -> str:
    return f"eval/{arm}_reward" if name == "reward" else f"eval/{arm}/{name}"


def _same(values) -> bool:
    if all(v is None for v in values):
        return True
    if any(v is None for v in values):
        return False
    return all(math.isclose(v, values[0], rel_tol=REL, abs_tol=REL) for v in values)


def table(run_dir: str, steps: tuple[int, int] | None = None) -> list[dict]:
    """One row per (step, arm, measure): loop, report, bench and whether they agree."""
    report, _ = analyse(run_dir)
    evals = sorted({c["step"] for c in report["checkpoints"] if c["phase"] == "eval"})
    if len(evals) < 2:
        raise SystemExit(f"measure_agreement: {run_dir} has {len(evals)} evaluation(s); "
                         "needs 2")
    first, last = steps or (evals[0], evals[-1])
    bench = compare(run_dir, first, last)
    logged = {r["step"]: r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))
              if r.get("phase") == "eval"}
    rows = []
    for step, side in ((first, "first"), (last, "last")):
        if step not in logged:
            raise SystemExit(f"measure_agreement: metrics.jsonl has no evaluation at step "
                             f"{step}")
        for arm in ARMS:
            cp = next((c for c in report["checkpoints"] if c["phase"] == "eval"
                       and c["step"] == step and c["arm"] == arm), None)
            if cp is None:
                continue
            for m in MEASURES:
                rep = cp[m.name]["estimate"] if cp[m.name] is not None else None
                b = bench["rise"].get(f"{arm}/all/{m.name}")
                values = [logged[step].get(_loop_key(arm, m.name)), rep,
                          b[side] if b is not None else None]
                rows.append({"step": step, "rl_step": cp["rl_step"], "arm": arm,
                             "measure": m.name, "loop": values[0], "report": values[1],
                             "bench": values[2], "agree": _same(values)})
    return rows


def markdown(rows: list[dict]) -> str:
    def cell(v):
        return "n/a" if v is None else f"{v:.4g}"

    lines = ["| RL step | arm | measure | loop | report | bench | agree |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['rl_step']} | {r['arm']} | {r['measure']} | {cell(r['loop'])} | "
              f"{cell(r['report'])} | {cell(r['bench'])} | {'yes' if r['agree'] else 'NO'} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument("--steps", default="", help="first,last evaluation steps (global steps)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    steps = tuple(int(s) for s in args.steps.split(",")) if args.steps else None
    rows = table(args.run, steps)
    numbers = [r for r in rows if r["report"] is not None]
    print(json.dumps({"run": args.run, "rows": len(rows), "with_a_number": len(numbers),
                      "agree": sum(r["agree"] for r in rows),
                      "disagree": [r for r in rows if not r["agree"]]}, indent=1))
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
