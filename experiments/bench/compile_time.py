"""Compile time against depth: the layer scan keeps it nearly flat.

    python -m experiments.bench.compile_time --preset=tiny --unit=ME --repeats=2,8

Compiles forward+backward (a training-shaped program) of the preset with pattern unit*repeats
for each repeat count, with the layer scan (default) and without it (one block per layer), on
abstract params (nothing allocated), and prints JSON with the times and their ratio.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from avalon.model import abstract_params, forward, presets

_PRESET = flags.DEFINE_enum("preset", "tiny", presets.NAMES, "Model preset to vary in depth.")
_UNIT = flags.DEFINE_string("unit", "ME", "Pattern unit repeated to build each depth.")
_REPEATS = flags.DEFINE_list("repeats", ["2", "8"], "Repeat counts of the unit.")
_SEQ = flags.DEFINE_integer("seq", 64, "Sequence length of the compiled program.")
_BATCH = flags.DEFINE_integer("batch", 2, "Batch of the compiled program.")


def compile_seconds(cfg, batch: int, seq: int) -> float:
    params = abstract_params(cfg)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

    def loss(p, t):
        return jnp.mean(forward(p, t, cfg).logits)

    start = time.perf_counter()
    jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
    return time.perf_counter() - start


def main(argv):
    del argv
    base = presets.get(_PRESET.value)
    # Warm up JAX/XLA (first-compile overheads) on a throwaway depth before timing.
    compile_seconds(base.replace(pattern=_UNIT.value), _BATCH.value, _SEQ.value)
    rows = []
    for scan in (True, False):
        for reps in (int(r) for r in _REPEATS.value):
            cfg = base.replace(pattern=_UNIT.value * reps, scan_layers=scan)
            rows.append({"scan_layers": scan, "layers": len(cfg.pattern),
                         "compile_s": round(compile_seconds(cfg, _BATCH.value, _SEQ.value), 2)})
    out = {"preset": _PRESET.value, "unit": _UNIT.value, "rows": rows}
    for scan in (True, False):
        times = [r["compile_s"] for r in rows if r["scan_layers"] == scan]
        out[f"ratio_deepest_to_shallowest_scan_{scan}"] = round(times[-1] / times[0], 2)
    out["depth_ratio"] = int(_REPEATS.value[-1]) / int(_REPEATS.value[0])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    app.run(main)
