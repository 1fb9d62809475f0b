"""The functions a caller may compute some of the model's layers with, passed as one argument.

The model's math is plain JAX: einsums, `jax.nn`, `jnp.take`. A caller that knows its platform
(the update step, the engine: `avalon/backends/`) may hand the model faster functions of the same
values, each of which its own tests hold to the model's reference; the model never asks which
platform it runs on. Every field left None means the model's own JAX.

    product(x2 [m, k], w2 [k, n], transpose_w=False) -> [m, n]
        a projection's product on flattened tokens (`dense.dense`); with transpose_w, w2 is
        [n, k] and the product is x2 @ w2.T. Used for array weights when no multi-device mesh
        is active (a flattened product would lose the axes' shardings).
    head_product(x2, w2, transpose_w=False) -> [m, n]
        the same, for the LM head (`dense.dense_head`, `dense.tied_head`), whose weight
        gradient a platform may lay out differently (V >> D).
    rms_norm(x, w, eps)                      `norms.rms_norm`'s function (fp32 arrays only)
    swiglu(gate, up) = silu(gate) * up       the SwiGLU MLP's activation (fp32 arrays only)
    attention(q [b, h, t*g, d], k, v [b, h, t, d], seg [b, t] int32, scale, g) -> [b, h, t*g, d]
        a fused causal, same-segment attention core equal to FLASH's (`attention._flash_core`),
        used in place of FLASH's blocks
    take_rows(table, idx)                    `jnp.take(table, idx, axis=0)`: the embedding
        lookup, with jnp.take's gradient
    kv_window_writes                         a paged KV pool is written one token's [h, d]
        window at a time (one scatter in place) instead of by whole pages
    moe_backend                              the MoE dispatch `MoeBackend.AUTO` means
    grouped_matmul(xs [R, a], w [G, a, b], counts [G]) -> [R, b]
        MEGABLOX's grouped product (`moe_ep`), a platform kernel: none in plain JAX
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from avalon.model.config import MoeBackend


@dataclasses.dataclass(frozen=True)
class Ops:
    product: Callable | None = None
    head_product: Callable | None = None
    rms_norm: Callable | None = None
    swiglu: Callable | None = None
    attention: Callable | None = None
    take_rows: Callable | None = None
    kv_window_writes: bool = False
    moe_backend: MoeBackend = MoeBackend.DENSE
    grouped_matmul: Callable | None = None

    def fp32_kernel(self, name: str, *arrays):
        """The `rms_norm` or `swiglu` field when set and every array is float32, else None
        (the kernels are written for fp32)."""
        fn = getattr(self, name)
        if fn is None or any(a.dtype != jnp.float32 for a in arrays):
            return None
        return fn


# The model's own JAX for every layer.
PLAIN = Ops()
