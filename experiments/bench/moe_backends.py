"""Forward+backward time of one MoE layer per dispatch backend (which backend AUTO picks on CPU).

    python -m experiments.bench.moe_backends --preset=toy --tokens=4096
    python -m experiments.bench.moe_backends --preset=toy --hidden_size=256 \
        --moe_intermediate_size=512       # the MoE layer of vs_torch.py's checkpoint

Times the jitted gradient of sum(y^2) of one MoE layer of the preset (single device, no
mesh) for DENSE, RAGGED_DOT and CAPACITY_BUCKETS, after one compiling and one warm-up call,
as the median of `--steps` calls. Prints one JSON object (milliseconds).
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from avalon.model import init_params, presets
from avalon.model.config import MoeBackend
from avalon.model.moe import moe_layer

_PRESET = flags.DEFINE_enum("preset", "toy", presets.NAMES, "Model preset (its first MoE layer).")
_TOKENS = flags.DEFINE_integer("tokens", 4096, "Tokens through the layer.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed calls.")
_HIDDEN = flags.DEFINE_integer("hidden_size", None, "Override the preset's width.")
_EXPERT = flags.DEFINE_integer("moe_intermediate_size", None, "Override the expert width.")


def main(argv):
    del argv
    overrides = {f: v for f, v in (("hidden_size", _HIDDEN.value),
                                   ("moe_intermediate_size", _EXPERT.value)) if v is not None}
    cfg = presets.get(_PRESET.value, **overrides)
    params = init_params(jax.random.key(0), cfg)
    block = next(b for b in params["blocks"] if any(k.endswith("_moe") for k in b))
    lp = jax.tree.map(lambda a: a[0], next(v for k, v in block.items() if k.endswith("_moe")))
    x = jax.random.normal(jax.random.key(1), (1, _TOKENS.value, cfg.hidden_size), cfg.jnp_dtype)
    out = {"preset": _PRESET.value, "overrides": overrides, "tokens": _TOKENS.value,
           "platform": jax.default_backend(), "ms": {}}
    for backend in (MoeBackend.DENSE, MoeBackend.RAGGED_DOT, MoeBackend.CAPACITY_BUCKETS):
        def loss(p, x, backend=backend):
            return jnp.sum(moe_layer(p, x, cfg, backend=backend)[0].astype(jnp.float32) ** 2)
        fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
        jax.block_until_ready(fn(lp, x))
        jax.block_until_ready(fn(lp, x))
        times = []
        for _ in range(_STEPS.value):
            start = time.perf_counter()
            jax.block_until_ready(fn(lp, x))
            times.append(time.perf_counter() - start)
        out["ms"][backend.value] = round(1e3 * statistics.median(times), 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    app.run(main)
