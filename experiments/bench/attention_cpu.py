"""Causal attention forward + backward on CPU: Avalon's kernels against torch's fused SDPA.

    taskset -c 1 python -m experiments.bench.attention_cpu --batch=8 --seq=512 --repeats=5
    # SmolLM2-135M's attention at the update step's 1,024-token row:
    taskset -c 1 python -m experiments.bench.attention_cpu --batch=1 --seq=1024 --heads=9 \
        --kv_heads=3 --head_dim=64 --repeats=7

The core of one attention layer of `vs_torch`'s 13.6M Nemotron-H (8 query / 4 kv heads of 32, fp32),
projections left out: `_full_attention` with each `AttentionImpl` (jitted value and gradient
of sum(out * probe); `kernel` is FLASH on the update step's fused C++ kernel on CPU,
`avalon/backends/cpu_attention.py`, when it builds) against
`torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` with
`backward`. Medians of `--repeats` after one warm-up; one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from avalon.backends import cpu_attention
from avalon.model import AttentionImpl, presets
from avalon.model.attention import _full_attention
from avalon.model.ops import PLAIN, Ops

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 8, "rows")
flags.DEFINE_integer("seq", 512, "tokens per row")
flags.DEFINE_integer("heads", 8, "query heads")
flags.DEFINE_integer("kv_heads", 4, "key/value heads")
flags.DEFINE_integer("head_dim", 32, "head width")
flags.DEFINE_integer("repeats", 5, "timed repeats (median)")


def _median(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_avalon(impl: AttentionImpl, q, k, v, probe, repeats, ops: Ops = PLAIN) -> float:
    cfg = presets.get("tiny", attention_impl=impl, attention_query_chunk=128)
    scale = q.shape[-1] ** -0.5

    def loss(q, k, v):
        return jnp.sum(_full_attention(q, k, v, None, cfg, scale, ops) * probe)

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    return _median(lambda: jax.block_until_ready(fn(q, k, v)), repeats)


def time_torch(q, k, v, probe, repeats) -> float:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    b, t, h, g, d = q.shape
    # [b, heads, t, d]; query head h*g + j reads kv head h (HF repeat_kv order).
    tq = torch.tensor(np.asarray(q).reshape(b, t, h * g, d)).transpose(1, 2).contiguous()
    tk = torch.tensor(np.asarray(k)).transpose(1, 2).contiguous()
    tv = torch.tensor(np.asarray(v)).transpose(1, 2).contiguous()
    tp = torch.tensor(np.asarray(probe).reshape(b, t, h * g, d)).transpose(1, 2).contiguous()
    for x in (tq, tk, tv):
        x.requires_grad_(True)

    def step():
        for x in (tq, tk, tv):
            x.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                               enable_gqa=True)
        (out * tp).sum().backward()

    return _median(step, repeats)


def main(argv):
    del argv
    b, t, nh, nkv, d = FLAGS.batch, FLAGS.seq, FLAGS.heads, FLAGS.kv_heads, FLAGS.head_dim
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, t, nkv, nh // nkv, d))
    k = jax.random.normal(keys[1], (b, t, nkv, d))
    v = jax.random.normal(keys[2], (b, t, nkv, d))
    probe = jax.random.normal(keys[3], q.shape)
    out = {"shape": [b, t, nh, nkv, d], "cpu_threads": len(os.sched_getaffinity(0)),
           "load_avg_1m": os.getloadavg()[0], "fwd_bwd_ms": {}}
    for impl in (AttentionImpl.NAIVE, AttentionImpl.BLOCK_CAUSAL, AttentionImpl.FLASH):
        out["fwd_bwd_ms"][impl.value] = 1e3 * time_avalon(impl, q, k, v, probe, FLAGS.repeats)
    if cpu_attention.ready():  # FLASH on the update step's fused kernel
        out["fwd_bwd_ms"]["kernel"] = 1e3 * time_avalon(
            AttentionImpl.FLASH, q, k, v, probe, FLAGS.repeats,
            Ops(attention=cpu_attention.attention_core))
    out["fwd_bwd_ms"]["torch_sdpa"] = 1e3 * time_torch(q, k, v, probe, FLAGS.repeats)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    app.run(main)
