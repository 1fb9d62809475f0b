"""The dense MLP (`-` layers): down(relu(up x)^2), non-gated, as HF `NemotronHMLP`."""

from __future__ import annotations

import jax

from avalon.model.config import ModelConfig
from avalon.model.dense import dense
from avalon.model.moe import relu2
from avalon.sharding import constrain


def mlp(p: dict, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    del cfg
    dtype = x.dtype
    h = dense(x, p["up"].astype(dtype))
    if "up_bias" in p:
        h = h + p["up_bias"].astype(dtype)
    h = constrain(relu2(h), ("batch", "act_seq", "act_mlp"))
    y = dense(h, p["down"].astype(dtype))
    if "down_bias" in p:
        y = y + p["down_bias"].astype(dtype)
    return y
