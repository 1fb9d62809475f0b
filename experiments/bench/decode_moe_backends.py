"""Decode with two MoE backends in one process, timed in alternation (issue 22).

    taskset -c 1 python -m experiments.bench.decode_moe_backends CKPT 1,8,32 7

CKPT is a vs_torch checkpoint (`vs_torch.build_checkpoint(CKPT, "issue")`); then the batch
sizes and the rounds. Same prompts, 128 greedy tokens, `Engine.generate` from fresh slots;
prints per batch the median tokens per CPU second of capacity buckets and grouped tiles, the
median of the per-round time ratios, and whether both produced the same tokens. In one process,
because separate processes on a shared host move by more than the difference measured.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from avalon.model.config import MoeBackend  # noqa: E402
from experiments.bench import vs_torch as V  # noqa: E402


def main(ckpt: str, batches: str, rounds: str) -> None:
    flags.FLAGS([sys.argv[0]])  # vs_torch's flags at their defaults (its Avalon overrides)
    cfg, params = V.load_avalon(ckpt, V.avalon_overrides())
    rng = np.random.default_rng(0)
    variants = {"capacity": cfg.replace(moe_backend=MoeBackend.CAPACITY_BUCKETS),
                "grouped": cfg.replace(moe_backend=MoeBackend.GROUPED)}
    for b in [int(x) for x in batches.split(",")]:
        prompts = V.random_ids(rng, cfg.vocab_size, (b, 64))
        engs = {k: V.make_engine(c, params, b, 192) for k, c in variants.items()}
        toks = {k: V.avalon_generate(e, prompts, 128) for k, e in engs.items()}
        same = bool((toks["capacity"] == toks["grouped"]).all())
        ts = {k: [] for k in engs}
        for _ in range(int(rounds)):
            for k, e in engs.items():
                t = time.process_time()
                V.avalon_generate(e, prompts, 128)
                ts[k].append(time.process_time() - t)
        med = {k: round(b * 128 / statistics.median(v), 1) for k, v in ts.items()}
        ratio = statistics.median(a / g for a, g in zip(ts["capacity"], ts["grouped"]))
        print(json.dumps({"b": b, "tok_s_cpu": med, "tokens_same": same,
                          "grouped_speedup_median_pair": round(ratio, 3)}),
              flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
