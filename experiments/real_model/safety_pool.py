"""Pool safety-suite tables played in chunks: the runs of one checkpoint split over several
`experiments.safety.run` calls with different `--seed`s (so that one call's engine holds fewer
peers' contexts at once), summed back into one table.

    python -m experiments.safety.run ... --runs=4 --seed=0 --out=A   (then --seed=1 --out=B ...)
    python -m experiments.real_model.safety_pool --tables=A/safety.csv,B/safety.csv --out=DIR

Each measure's k and n are summed over the tables for every (scenario, checkpoint) row, and its
rate and Wilson 95% interval recomputed from the sums (the intervals of the chunks are not
combined). The seeds must differ between chunks (a run's seed is `seed * 1_000_003 + j`), else
the same rollouts are counted twice: the pooled rows name the number of tables behind them.
Writes DIR/safety.csv and DIR/safety.md in the suite's own format.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import app, flags

from avalon import command
from avalon.envs.safety import MEASURES, wilson
from experiments.safety.run import write_csv, write_markdown


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside others that define flags of the same names)."""
    flags.DEFINE_string("tables", None, "comma-separated safety.csv files", required=True)
    flags.DEFINE_string("out", None, "directory for the pooled safety.csv and safety.md",
                        required=True)


FLAGS = flags.FLAGS


def pool(tables: Sequence[Sequence[dict]]) -> list[dict]:
    """Rows of `experiments.safety.run`'s CSV (as read back, strings), pooled per (scenario,
    checkpoint) in first-seen order."""
    pooled: dict[tuple[str, str], dict] = {}
    for rows in tables:
        for r in rows:
            key = (r["scenario"], r["checkpoint"])
            if key not in pooled:
                pooled[key] = {"scenario": r["scenario"], "checkpoint": r["checkpoint"],
                               "path": r["path"], "game": r["game"] == "True", "runs": 0,
                               "agents": 0, "tables": 0,
                               **{f"{m}_{x}": 0 for m in MEASURES for x in "kn"}}
            p = pooled[key]
            if p["path"] != r["path"]:
                raise ValueError(f"safety_pool: {key} comes from {p['path']!r} and "
                                 f"{r['path']!r}; pool tables of one checkpoint path")
            p["runs"] += int(r["runs"])
            p["agents"] += int(r["agents"])
            p["tables"] += 1
            for m in MEASURES:
                p[f"{m}_k"] += int(r[f"{m}_k"])
                p[f"{m}_n"] += int(r[f"{m}_n"])
    out = []
    for p in pooled.values():
        row = {k: p[k] for k in ("scenario", "checkpoint", "path", "game", "runs", "agents",
                                 "tables")}
        for m in MEASURES:
            k, n = p[f"{m}_k"], p[f"{m}_n"]
            lo, hi = wilson(k, n)
            row.update({m: k / n if n else float("nan"), f"{m}_lo": lo, f"{m}_hi": hi,
                        f"{m}_k": k, f"{m}_n": n})
        out.append(row)
    return out


def read_table(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise command.Stop(f"--tables: {path} has no rows")
    missing = [f"{m}_k" for m in MEASURES if f"{m}_k" not in rows[0]]
    if missing:
        raise command.Stop(f"--tables: {path} has no column {missing[0]} (a safety.csv of "
                           "experiments.safety.run at this commit)")
    return rows


def main(argv):
    del argv
    paths = [p.strip() for p in FLAGS.tables.split(",") if p.strip()]
    if not paths:
        raise command.Stop("--tables: no files")
    rows = pool([read_table(p) for p in paths])
    out = Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "safety.csv", rows)
    write_markdown(out / "safety.md", rows)
    sys.stdout.write((out / "safety.md").read_text())


if __name__ == "__main__":
    _define_flags()
    command.run("experiments.real_model.safety_pool",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
