"""Where a run's time went, from WORKDIR/metrics.jsonl: the run report's timing table and plot.

An RLCR step's line carries its wall time (`time/step_s`) and its parts: rollouts, the batch
build, the update, the engine's switch (`STEP_PARTS`), the rollouts' own split into prefill,
decode, host work and waiting (`ROLLOUT_PARTS`), and the compile time inside the step
(`time/compile_s`), besides the engine's and the step's rates (`RATES`). Runs of older code
lack some of them: a field is shown where a line has it. `unaccounted_s` is the step's wall
time in none of its parts (`time/step_s` less `STEP_PARTS`): what no `time/*` field explains.
SFT steps (`time/step_s` of `phase: sft` lines) and evaluations (`time/eval_s`) are shown
beside them.

A row's `mean` is over the lines after the phase's first (which compiles its programs), or the
one line when there is one; `first` is the first line's value.
"""

from __future__ import annotations

import json
import os

STEP_PARTS = ("time/rollout_s", "time/build_s", "time/update_s", "time/switch_s")
ROLLOUT_PARTS = ("time/rollout_prefill_s", "time/rollout_decode_s", "time/rollout_host_s",
                 "time/rollout_wait_s")
RATES = ("engine/live_rows_mean", "perf/rollouts_per_hour", "perf/generated_tokens_per_s")
RL_FIELDS = ("time/step_s", *STEP_PARTS, *ROLLOUT_PARTS, "time/compile_s", *RATES)
UNACCOUNTED = "unaccounted_s"


def read_metrics(run_dir: str) -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl ([] without one; a torn last line is dropped)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _row(phase: str, field: str, values: list[float], step_mean: float | None) -> dict:
    later = values[1:] or values
    mean = sum(later) / len(later)
    share = mean / step_mean if step_mean and field.startswith("time/") \
        and field != "time/step_s" else None
    return {"phase": phase, "field": field, "lines": len(values), "first": values[0],
            "mean": mean, "share_of_step": share}


def timing(records: list[dict]) -> dict:
    """`steps`: per RLCR line its `rl_step`, every `RL_FIELDS` field it has and
    `unaccounted_s` (with `time/step_s` and every step part); `rows`: per phase and field,
    `first`, `mean` (see the module docstring), `lines`, and `share_of_step` (of the mean
    `time/step_s`, for RLCR time fields)."""
    rl = [r for r in records if r.get("phase") == "rl"]
    steps = []
    for r in rl:
        row = {"rl_step": r.get("rl_step")}
        row |= {k: _num(r[k]) for k in RL_FIELDS if _num(r.get(k)) is not None}
        if "time/step_s" in row and all(k in row for k in STEP_PARTS):
            row[UNACCOUNTED] = row["time/step_s"] - sum(row[k] for k in STEP_PARTS)
        steps.append(row)
    rows = []
    for phase, field in (("sft", "time/step_s"), ("eval", "time/eval_s")):
        values = [_num(r.get(field)) for r in records if r.get("phase") == phase]
        values = [v for v in values if v is not None]
        if values:
            rows.append(_row(phase, field, values, None))
    step_values = [s["time/step_s"] for s in steps if "time/step_s" in s]
    step_mean = _row("rl", "time/step_s", step_values, None)["mean"] if step_values else None
    for field in (*RL_FIELDS, UNACCOUNTED):
        values = [s[field] for s in steps if field in s]
        if values:
            rows.append(_row("rl", field, values, step_mean))
    return {"steps": steps, "rows": rows}
