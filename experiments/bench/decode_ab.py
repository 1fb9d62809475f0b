"""Decode with two engine variants in one process, timed in alternation.

    taskset -c 1 python -m experiments.bench.decode_ab CKPT 1,8,32 7 moe
    taskset -c 1 python -m experiments.bench.decode_ab CKPT 1,8,32 7 layout

CKPT is a vs_torch checkpoint (`vs_torch.build_checkpoint(CKPT, "issue")`); then the batch
sizes, the rounds and which pair:
  moe     the routed experts as capacity buckets (A) against grouped tiles (B)
  layout  the engine's weights in their own [in, out] layout (A, `Engine(backend=
          "cpu_unstacked")`) against output-first (B, `backend="cpu_out_in"`)
Same prompts, 128 greedy tokens, `Engine.generate` from fresh slots; prints per batch the
median tokens per CPU second of A and B, the median of the per-round time ratios A / B, and
whether both produced the same tokens. In one process, because separate processes on a shared
host move by more than the difference measured.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from avalon.inference.engine import Engine  # noqa: E402
from avalon.model.config import MoeBackend  # noqa: E402
from experiments.bench import vs_torch as V  # noqa: E402


def variants(cfg, pair: str) -> dict:
    """name -> (config, Engine keyword arguments) for A and B."""
    if pair == "moe":
        return {"capacity": (cfg.replace(moe_backend=MoeBackend.CAPACITY_BUCKETS), {}),
                "grouped": (cfg.replace(moe_backend=MoeBackend.GROUPED), {})}
    if pair == "layout":
        return {"in_out": (cfg, {"backend": "cpu_unstacked"}),
                "out_in": (cfg, {"backend": "cpu_out_in"})}
    raise ValueError(f"decode_ab: pair={pair!r} must be 'moe' or 'layout'")


def main(ckpt: str, batches: str, rounds: str, pair: str) -> None:
    flags.FLAGS([sys.argv[0]])  # vs_torch's flags at their defaults (its Avalon overrides)
    cfg, params = V.load_avalon(ckpt, V.avalon_overrides())
    rng = np.random.default_rng(0)
    pairs = variants(cfg, pair)
    a, b = pairs
    for batch in [int(x) for x in batches.split(",")]:
        prompts = V.random_ids(rng, cfg.vocab_size, (batch, 64))
        engs = {k: Engine(c, params, num_slots=batch, max_context=192, **kw)
                for k, (c, kw) in pairs.items()}
        toks = {k: V.avalon_generate(e, prompts, 128) for k, e in engs.items()}
        same = bool((toks[a] == toks[b]).all())
        ts = {k: [] for k in engs}
        for _ in range(int(rounds)):
            for k, e in engs.items():
                t = time.process_time()
                V.avalon_generate(e, prompts, 128)
                ts[k].append(time.process_time() - t)
        med = {k: round(batch * 128 / statistics.median(v), 1) for k, v in ts.items()}
        ratio = statistics.median(x / y for x, y in zip(ts[a], ts[b]))
        print(json.dumps({"b": batch, "pair": pair, "tok_s_cpu": med, "tokens_same": same,
                          f"{b}_speedup_median_pair": round(ratio, 3)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
