"""Causal attention for training on CPU: a fused C++ kernel (forward and backward) behind XLA's
FFI: the update step's `Ops.attention` on a CPU with one device (`training.TrainingPlatform`).

The model's FLASH attention (`model.attention._flash_attention`) runs on XLA:CPU as separate
passes over every block of scores (product, mask, row max and sum, exponentials, copies of K and
V): at SmolLM2-135M's shapes its forward and backward ran at ~35 GFLOP/s where the products
around it run at ~130.
`cpu_attention.cc` makes, masks and uses each block of scores while it is in L1, in one pass, with
the same function: `_flash_core`'s layout and results (its output, and gradients from the rows'
log-sum-exp, equal to rounding; tests/backends/test_cpu_attention.py). fp32 only, head_dim a
multiple of 16 (`fits`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from avalon.backends import cpu_build
from avalon.model.config import ModelConfig

SOURCE = Path(__file__).with_suffix(".cc")
FORWARD_TARGET = "avalon_attention_fwd"
BACKWARD_TARGET = "avalon_attention_bwd"
_SYMBOLS = {FORWARD_TARGET: "AvalonAttentionForward", BACKWARD_TARGET: "AvalonAttentionBackward"}
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128, 192, 256)  # cpu_attention.cc: ProductFor


def fits(cfg: ModelConfig) -> bool:
    """Whether the kernel computes this model's attention: fp32 activations, a head width it
    has a product for."""
    return jnp.dtype(cfg.dtype) == jnp.float32 and cfg.head_dim in HEAD_DIMS


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def attention_core(q, k, v, seg, scale: float, g: int):
    """q [b, h, t*g, d] (row m: query m // g of head (kv head, m % g)); k, v [b, h, t, d];
    seg [b, t] int32 -> out [b, h, t*g, d]: causal, same-segment softmax(scale q.k) v, fp32."""
    del g
    return _forward(q, k, v, seg, scale)[0]


def _forward(q, k, v, seg, scale):
    f32 = jnp.float32
    out = (jax.ShapeDtypeStruct(q.shape, f32), jax.ShapeDtypeStruct(q.shape[:3], f32))
    return jax.ffi.ffi_call(FORWARD_TARGET, out, vmap_method="sequential")(
        q.astype(f32), k.astype(f32), v.astype(f32), seg.astype(jnp.int32),
        scale=np.float32(scale))


def _core_fwd(q, k, v, seg, scale, g):
    del g
    out, lse = _forward(q, k, v, seg, scale)
    return out, (q, k, v, seg, out, lse)


def _core_bwd(scale, g, res, dout):
    del g
    q, k, v, seg, out, lse = res
    f32 = jnp.float32
    grads = (jax.ShapeDtypeStruct(q.shape, f32), jax.ShapeDtypeStruct(k.shape, f32),
             jax.ShapeDtypeStruct(v.shape, f32))
    dq, dk, dv = jax.ffi.ffi_call(BACKWARD_TARGET, grads, vmap_method="sequential")(
        q, k, v, seg, out, lse, dout.astype(f32), scale=np.float32(scale))
    return dq, dk, dv, None


attention_core.defvjp(_core_fwd, _core_bwd)


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel's FFI targets; True when the update
    step can use it. On a failure, one warning and False: the update step then keeps the
    model's FLASH attention."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "attention",
                           "training uses the model's flash attention")
