"""XLA:CPU's product against the engine's CPU kernel (`avalon/backends/cpu_gemm.py`), few rows.

    taskset -c 1 python -m experiments.bench.cpu_gemm --rows=1,8,32,64,512

Decode reads every weight once per step for a handful of rows, from memory (the weights of a
model do not fit in cache), so each case chains `--weights` distinct [K, O] weights (48 MB at
the defaults, more than this host's 32 MB L3), each product feeding the next, inside a
`fori_loop` of `--rounds` (as the engine's decode loop runs them). Sides: XLA's product with
the weight [in, out] (`x @ w`) and output-first (`backends.cpu_out_in.OutIn`: w_t @ x.T, the
engine's layout without the kernel), and the kernel on the packed weight. Reports
microseconds per product, the weight bytes streamed per second, and kernel / XLA ratios, as one
JSON object; the kernel's outputs are checked against `x @ w` first.
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from avalon.backends import cpu_gemm
from avalon.backends.cpu_out_in import OutIn, out_in_product

flags.DEFINE_list("rows", ["1", "8", "32", "64", "512"], "token rows per product")
flags.DEFINE_integer("k", 256, "input width")
flags.DEFINE_integer("o", 512, "output width")
flags.DEFINE_integer("weights", 96, "distinct weights chained per round")
flags.DEFINE_integer("rounds", 4, "rounds of the chain per timed call")
flags.DEFINE_integer("repeats", 7, "timed calls (median reported)")
FLAGS = flags.FLAGS


def chain(product):
    """x [n, K] through every weight in turn (each output's first K columns feed the next)."""
    def run(x, weights):
        def one_round(_, a):
            for w in weights:
                a = a + product(a, w)[:, :a.shape[1]]
            return a
        return jax.lax.fori_loop(0, FLAGS.rounds, one_round, x)
    return jax.jit(run)


def time_call(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(FLAGS.repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv):
    del argv
    if not cpu_gemm.ready():
        raise SystemExit("cpu_gemm: the kernel did not build on this machine")
    k, o, count = FLAGS.k, FLAGS.o, FLAGS.weights
    if o < k:
        raise SystemExit(f"--o={o} must be >= --k={k} (each output feeds the next product)")
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((k, o), np.float32) / np.sqrt(k) * 0.1)
          for _ in range(count)]
    sides = {
        "xla_in_out": (chain(lambda a, w: a @ w), ws),
        "xla_out_in": (chain(lambda a, w: out_in_product(a, w.t)), [OutIn.of(w, 1) for w in ws]),
        "kernel": (chain(cpu_gemm.rows_product), [cpu_gemm.Packed.of(w, 1) for w in ws]),
    }
    result = {"k": k, "o": o, "weights": count, "weight_mb": count * k * o * 4 / 2**20,
              "rounds": FLAGS.rounds, "us_per_product": {}, "weight_gb_per_s": {}, "ratio": {}}
    per_call = FLAGS.rounds * count
    for rows in (int(r) for r in FLAGS.rows):
        x = jnp.asarray(rng.standard_normal((rows, k), np.float32))
        want = np.asarray(x) @ np.asarray(ws[0])
        got = jax.jit(cpu_gemm.rows_product)(x, sides["kernel"][1][0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        us = {name: time_call(fn, x, w) / per_call * 1e6 for name, (fn, w) in sides.items()}
        result["us_per_product"][rows] = us
        result["weight_gb_per_s"][rows] = {n: k * o * 4 / (t * 1e-6) / 1e9 for n, t in us.items()}
        result["ratio"][rows] = {"kernel_vs_in_out": us["xla_in_out"] / us["kernel"],
                                 "kernel_vs_out_in": us["xla_out_in"] / us["kernel"]}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    app.run(main)
