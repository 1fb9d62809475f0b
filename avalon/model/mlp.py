"""The dense MLP (`-` layers): down(relu(up x)^2), non-gated, as HF `NemotronHMLP`; under
Activation.SWIGLU down(silu(gate x) * up x), as HF `LlamaMLP` / `Qwen2MLP` / `Qwen3MLP`."""

from __future__ import annotations

import jax

from avalon.model.activations import relu2
from avalon.model.config import Activation, ModelConfig
from avalon.model.dense import dense
from avalon.model.ops import PLAIN, Ops
from avalon.sharding import constrain


def mlp(p: dict, x: jax.Array, cfg: ModelConfig, ops: Ops = PLAIN) -> jax.Array:
    dtype = x.dtype
    h = dense(x, p["up"].astype(dtype), ops=ops)
    if "up_bias" in p:
        h = h + p["up_bias"].astype(dtype)
    if cfg.mlp_activation == Activation.SWIGLU:
        gate = dense(x, p["gate"].astype(dtype), ops=ops)
        if "gate_bias" in p:
            gate = gate + p["gate_bias"].astype(dtype)
        fn = ops.fp32_kernel("swiglu", gate, h)  # the platform's kernel, where one is given
        h = jax.nn.silu(gate) * h if fn is None else fn(gate, h)
    else:
        h = relu2(h)
    h = constrain(h, ("batch", "act_seq", "act_mlp"))
    y = dense(h, p["down"].astype(dtype), ops=ops)
    if "down_bias" in p:
        y = y + p["down_bias"].astype(dtype)
    return y
