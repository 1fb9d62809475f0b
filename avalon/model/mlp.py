"""The dense MLP (`-` layers): down(relu(up x)^2), non-gated, as HF `NemotronHMLP`; under
Activation.SWIGLU down(silu(gate x) * up x), as HF `LlamaMLP` / `Qwen2MLP` / `Qwen3MLP`."""

from __future__ import annotations

import jax

from avalon.model import kernels
from avalon.model.activations import relu2
from avalon.model.config import Activation, ModelConfig
from avalon.model.dense import dense
from avalon.sharding import constrain


def mlp(p: dict, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    dtype = x.dtype
    h = dense(x, p["up"].astype(dtype))
    if "up_bias" in p:
        h = h + p["up_bias"].astype(dtype)
    if cfg.mlp_activation == Activation.SWIGLU:
        gate = dense(x, p["gate"].astype(dtype))
        if "gate_bias" in p:
            gate = gate + p["gate_bias"].astype(dtype)
        fn = kernels.get("swiglu", gate, h)  # a platform kernel where one is set
        h = jax.nn.silu(gate) * h if fn is None else fn(gate, h)
    else:
        h = relu2(h)
    h = constrain(h, ("batch", "act_seq", "act_mlp"))
    y = dense(h, p["down"].astype(dtype))
    if "down_bias" in p:
        y = y + p["down_bias"].astype(dtype)
    return y
