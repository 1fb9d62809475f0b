"""The dense MLP (`-` layers): down(relu(up x)^2), non-gated, as HF `NemotronHMLP`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon.model.config import ModelConfig
from avalon.model.moe import relu2
from avalon.sharding import constrain


def mlp(p: dict, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    del cfg
    dtype = x.dtype
    h = jnp.einsum("btd,df->btf", x, p["up"].astype(dtype))
    if "up_bias" in p:
        h = h + p["up_bias"].astype(dtype)
    h = constrain(relu2(h), ("batch", "act_seq", "act_mlp"))
    y = jnp.einsum("btf,fd->btd", h, p["down"].astype(dtype))
    if "down_bias" in p:
        y = y + p["down_bias"].astype(dtype)
    return y
