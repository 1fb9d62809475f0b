"""Continuous batching against the engine as it was before continuous batching, in one command.

    python -m experiments.bench.continuous_vs_pre16                 # toy, 3 interleaved repeats

The old tick batching is the engine of the commit before continuous batching (PRE16, the
parent of its first commit): one `generate` per tick over every agent, a KV cache
bucketed by the longest context, and finished rows kept in the decode batch until the tick's
longest turn ends. That engine cannot run beside the paged one in one process, so each side is
its own process: `git archive PRE16 avalon` is unpacked into a temporary directory and put first
on PYTHONPATH for the old side; both sides run `continuous_batching.py` (the same workload:
model preset, MoE backend, seeds, turn lengths) with its own untimed warm-ups, and the sides
alternate old / new `--repeats` times, so load on this shared machine hits both alike.

Sides: `pre16 tick` (the old engine, tick mode), `new tick` and `new continuous` (this tree's
engine, both modes in one process). Prints one JSON object: every repeat's tokens/s with the
load average around it, the medians, and continuous / pre16-tick (the issue's target: >= 1.3).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

PRE16 = "682bf1b7172490c0fd93128cffcf0e3d0d8f2416"  # continuous batching's first: 4921f16
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "experiments", "bench", "continuous_batching.py")

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 3, "old/new process pairs, interleaved")
flags.DEFINE_string("commit", PRE16, "the old engine's commit")
flags.DEFINE_list("workload", [], "flags passed to both sides, e.g. agents=16,turns=4")
flags.DEFINE_integer("warmups", 2, "untimed runs of each mode in each process (the old "
                     "engine needs two: the first grows its KV buckets, the second compiles "
                     "the rest)")


def side(pythonpath: str, modes: str) -> dict:
    args = [sys.executable, BENCH, f"--modes={modes}", "--repeats=1",
            f"--warmups={FLAGS.warmups}"] + [f"--{w}" for w in FLAGS.workload]
    env = dict(os.environ, PYTHONPATH=pythonpath, JAX_PLATFORMS="cpu")
    load = os.getloadavg()[0]
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout[r.stdout.index("{"):])
    out["load_avg_1min"] = [load, os.getloadavg()[0]]
    return out


def main(argv):
    del argv
    with tempfile.TemporaryDirectory() as old:
        tar = subprocess.run(["git", "-C", REPO, "archive", FLAGS.commit, "avalon"],
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=tar, check=True)
        runs = []
        for _ in range(FLAGS.repeats):
            pre = side(old, "tick")
            new = side(REPO, "tick,continuous")
            assert pre["avalon"].startswith(old) and new["avalon"].startswith(REPO), (pre, new)
            assert pre["generated_tokens"] == new["generated_tokens"]
            runs.append({"pre16_tick": pre["tokens_per_s"]["tick"][0],
                         "new_tick": new["tokens_per_s"]["tick"][0],
                         "new_continuous": new["tokens_per_s"]["continuous"][0],
                         "decode_dispatches": {"pre16_tick": pre["decode_dispatches"]["tick"][0],
                                               "new_tick": new["decode_dispatches"]["tick"][0],
                                               "new_continuous":
                                                   new["decode_dispatches"]["continuous"][0]},
                         "load_avg_1min": {"pre16": pre["load_avg_1min"],
                                           "new": new["load_avg_1min"]}})
    median = {k: statistics.median(r[k] for r in runs)
              for k in ("pre16_tick", "new_tick", "new_continuous")}
    print(json.dumps({
        "commit": FLAGS.commit, "workload": FLAGS.workload,
        "generated_tokens": new["generated_tokens"], "preset": new["preset"],
        "runs": runs, "median_tokens_per_s": median,
        "continuous_over_pre16_tick": median["new_continuous"] / median["pre16_tick"],
        "continuous_over_new_tick": median["new_continuous"] / median["new_tick"],
        "new_tick_over_pre16_tick": median["new_tick"] / median["pre16_tick"],
    }, indent=1))


if __name__ == "__main__":
    app.run(main)
