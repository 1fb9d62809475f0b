"""RLCR steps of a config end to end, timed and split, optionally against another commit.

    python -m experiments.bench.rlcr_step --config=configs/smol_org.py \
        --init_from=RUN --steps=3 [--against=COMMIT] [--config.rollout.rollouts_per_group=8]

Each side is a worker process (`rlcr_step_worker.py`, run in its own tree: this checkout, and
with `--against` a detached git worktree of COMMIT made under `--trees`) that builds the run
from `--config` (SFT, evaluation, checkpoints and plots left out; `--config.*` overrides passed
to both sides) starting from `--init_from` (a post-SFT run directory, so both sides play the
same model), plays `--warmup` steps (compilation), then `--steps` measured steps. The sides
alternate step by step (A B, B A, ...), the idle one blocked on its pipe, so the load of a
shared machine falls on both alike; every step starts from the same params, so learning does
not drift the two apart.

Per step and side: wall time; the run's own `metrics.jsonl` record (rollout / build / update /
switch times, rollouts, tokens); the engine's device calls timed by kind (prefill, decode,
state ops), rows per decode dispatch and their mean context; compile time in the step. Then the
references the step is held against, measured once by this checkout's worker after its steps:
the engine's own decode at the steps' median live batch and context
(`engine_decode_tokens_per_s`), and Avalon's SmolLM2 update step as `vs_torch` times it
(`reference_update_tokens_per_s`).

Prints one JSON line per step as it comes, then a summary, and ends with one JSON line holding
`rollouts_per_hour`, `generated_tokens_per_s`, `engine_decode_tokens_per_s`,
`update_tokens_per_s`, `reference_update_tokens_per_s` (this checkout, medians of the measured
steps) and, with `--against`, the same for the other commit under `against` and
`rollouts_per_hour_ratio` (median of each alternating pair's ratio, this / against).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "the run config (configs/*.py[:arg])")
flags.DEFINE_string("init_from", None, "a post-SFT run directory both sides start every step "
                    "from (default: the config's own init_from)")
flags.DEFINE_integer("steps", 3, "measured RLCR steps per side")
flags.DEFINE_integer("warmup", 1, "RLCR steps per side before measuring (compilation)")
flags.DEFINE_string("against", None, "a commit to measure side by side with this checkout")
flags.DEFINE_string("trees", os.path.join(tempfile.gettempdir(), "avalon-rlcr-trees"),
                    "where the --against worktree is made")
flags.DEFINE_bool("refs", True, "measure the decode and update references")
flags.DEFINE_bool("update_reference", True, "with --refs: also vs_torch's SmolLM2 update step")
flags.DEFINE_string("out", None, "also write every record and the summary to this JSON file")
FLAGS = flags.FLAGS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _config_args(argv: list[str]) -> list[str]:
    """The command line's `--config` flag and its overrides, as given (for both workers)."""
    return [a for a in argv[1:] if a.startswith("--config")]


def make_tree(commit: str) -> str:
    """A detached worktree of `commit` (reused if it is already there)."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode:
        raise SystemExit(f"--against={commit}: not a commit of this repository")
    sha = sha.stdout.strip()
    path = os.path.join(FLAGS.trees, sha[:12])
    if not os.path.isdir(path):
        os.makedirs(FLAGS.trees, exist_ok=True)
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha],
                       check=True, capture_output=True)
    return path


class Side:
    """A worker process in `tree`, spoken to over its pipes."""

    def __init__(self, name: str, tree: str, config_args: list[str]):
        self.name, self.tree = name, tree
        self.workdir = tempfile.mkdtemp(prefix=f"rlcr-{name}-")
        script = os.path.join(self.workdir, "rlcr_step_worker.py")
        shutil.copy(os.path.join(HERE, "rlcr_step_worker.py"), script)
        args = [sys.executable, script, *config_args, f"--workdir={self.workdir}/run",
                f"--update_reference={FLAGS.update_reference}"]
        if FLAGS.init_from:
            args.append(f"--init_from={os.path.abspath(FLAGS.init_from)}")
        env = {**os.environ, "PYTHONPATH": tree}
        self.proc = subprocess.Popen(args, cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.ready = self._read()

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"rlcr_step: the {self.name} worker ({self.tree}) ended "
                                 f"(exit {self.proc.wait()}); its stderr says why")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return {"side": self.name, **self._read()}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def step_numbers(s: dict) -> dict:
    """The numbers a step is judged by."""
    r, split = s["record"], s["split"]
    rollouts = r.get("rollouts", 0)
    rollout_s = r.get("time/rollout_s", 0.0)
    update_s = r.get("time/update_s", 0.0)
    secs = split["seconds"]
    prefill_s, decode_s = secs.get("prefill", 0.0), secs.get("decode", 0.0)
    state_s = sum(v for k, v in secs.items() if k not in ("prefill", "decode"))
    return {
        "wall_s": s["wall_s"], "compile_s": s["compile_s"], "rollouts": rollouts,
        "rollouts_per_hour": 3600.0 * rollouts / s["wall_s"],
        "generated_tokens": s["decode_tokens"], "prefill_tokens": s["prefill_tokens"],
        "generated_tokens_per_rollout": s["decode_tokens"] / max(rollouts, 1),
        "generated_tokens_per_s": s["decode_tokens"] / max(rollout_s, 1e-9),
        "update_tokens": r.get("train/tokens", 0.0),
        "update_tokens_per_s": r.get("train/tokens", 0.0) / max(update_s, 1e-9),
        "update_calls": r.get("train/updates", 1.0),
        "time/rollout_s": rollout_s, "time/rollout_prefill_s": prefill_s,
        "time/rollout_decode_s": decode_s, "time/rollout_state_ops_s": state_s,
        "time/rollout_host_s": max(rollout_s - prefill_s - decode_s - state_s, 0.0),
        "time/build_s": r.get("time/build_s", 0.0), "time/update_s": update_s,
        "time/switch_s": r.get("time/switch_s", 0.0),
        "live_rows_per_decode": s["live_rows_per_decode"],
        "decode_row_fill": s["split"]["decode_rows"] / max(s["split"]["decode_row_slots"], 1),
        "decode_context_mean": s["decode_context_mean"],
        "decode_dispatches": split["calls"].get("decode", 0),
        "prefill_dispatches": split["calls"].get("prefill", 0),
        "kept_groups": r.get("batch/kept_groups"), "groups": r.get("batch/groups"),
        "reward_mean": r.get("reward/mean", r.get("batch/reward_mean")),
        "max_rss_gb": s["max_rss_gb"],
    }


def medians(steps: list[dict]) -> dict:
    keys = [k for k, v in steps[0].items() if isinstance(v, (int, float)) and v is not None]
    return {k: statistics.median(s[k] for s in steps if s.get(k) is not None) for k in keys}


def main(argv):
    config_args = _config_args(sys.argv)
    if not config_args:
        raise SystemExit("rlcr_step: --config is required")
    sides = [Side("this", ROOT, config_args)]
    records = []
    try:
        if FLAGS.against:
            sides.append(Side("against", make_tree(FLAGS.against), config_args))
        for side in sides:
            for _ in range(FLAGS.warmup):
                r = side.ask("step")
                r["warmup"] = True
                records.append(r)
                print(json.dumps({"side": side.name, "warmup": True,
                                  **step_numbers(r)}), flush=True)
        measured = {s.name: [] for s in sides}
        for i in range(FLAGS.steps):
            order = sides if i % 2 == 0 else sides[::-1]
            for side in order:
                r = side.ask("step")
                records.append(r)
                numbers = step_numbers(r)
                measured[side.name].append(numbers)
                print(json.dumps({"side": side.name, "step": i, **numbers}), flush=True)
        # The references run with this side alone: its run, the other side's and the
        # references' models at once did not fit 24 GB (the worker was OOM-killed).
        for side in sides[1:]:
            side.close()
        refs = {}
        if FLAGS.refs:
            try:
                refs = sides[0].ask("refs")
            except SystemExit as e:  # the measured steps are kept (the summary below)
                print(e, file=sys.stderr, flush=True)
                refs = {"error": str(e)}
        records.append(refs)
    finally:
        for side in sides:
            side.close()
    summary = {name: medians(steps) for name, steps in measured.items()}
    this = summary["this"]
    final = {"config": config_args, "init_from": FLAGS.init_from, "steps": FLAGS.steps,
             "rollouts_per_hour": this["rollouts_per_hour"],
             "generated_tokens_per_s": this["generated_tokens_per_s"],
             "engine_decode_tokens_per_s": refs.get("engine_decode_tokens_per_s"),
             "engine_decode_rows": refs.get("engine_decode_rows"),
             "update_tokens_per_s": this["update_tokens_per_s"],
             "reference_update_tokens_per_s": refs.get("reference_update_tokens_per_s"),
             "this": this}
    if FLAGS.against:
        pairs = [a["rollouts_per_hour"] / b["rollouts_per_hour"]
                 for a, b in zip(measured["this"], measured["against"])]
        final.update({"against_commit": FLAGS.against, "against": summary["against"],
                      "rollouts_per_hour_ratio": statistics.median(pairs),
                      "rollouts_per_hour_pair_ratios": pairs})
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({"records": records, "summary": final}, f, indent=1, default=float)
    print(json.dumps(final, default=float), flush=True)


if __name__ == "__main__":
    app.run(main)
