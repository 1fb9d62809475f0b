"""RMSNorm for training on CPU: a C++ kernel (forward and backward) behind XLA's FFI, the
model's `rms_norm` in the update step (`Ops.rms_norm`).

XLA:CPU runs `model.norms.rms_norm` as three passes forward and four or five backward (~0.16 s
of SmolLM2-135M's update step on one core; `experiments/bench/RESULTS.md`, "SmolLM2's update step
against transformers on one core");
`cpu_rms_norm.cc` reads each row twice each way, in L1. Same function and gradients, equal to
rounding: tests/backends/test_cpu_layer_kernels.py. fp32; the update step uses it on a CPU with
one device (`training.TrainingPlatform`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from avalon.backends import cpu_build

SOURCE = Path(__file__).with_suffix(".cc")
FORWARD_TARGET = "avalon_rms_norm_fwd"
BACKWARD_TARGET = "avalon_rms_norm_bwd"
_SYMBOLS = {FORWARD_TARGET: "AvalonRmsNormForward", BACKWARD_TARGET: "AvalonRmsNormBackward"}


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """`model.norms.rms_norm` for fp32 x [..., d] and w [d] on the kernel (`ready()` must be
    True)."""
    d = x.shape[-1]
    if w.shape != (d,) or x.dtype != jnp.float32 or w.dtype != jnp.float32:
        raise ValueError(f"cpu_rms_norm: x {x.shape} {x.dtype} and w {w.shape} {w.dtype} must "
                         "be float32 with w [d]")
    return _norm(x.reshape(-1, d), w, float(eps)).reshape(x.shape)


def _forward(x2, w, eps):
    out = (jax.ShapeDtypeStruct(x2.shape, jnp.float32),
           jax.ShapeDtypeStruct(x2.shape[:1], jnp.float32))
    return jax.ffi.ffi_call(FORWARD_TARGET, out, vmap_method="sequential")(
        x2, w, eps=np.float32(eps))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _norm(x2, w, eps):
    return _forward(x2, w, eps)[0]


def _norm_fwd(x2, w, eps):
    y, rstd = _forward(x2, w, eps)
    return y, (x2, w, rstd)


def _norm_bwd(eps, res, dy):
    del eps
    x2, w, rstd = res
    grads = (jax.ShapeDtypeStruct(x2.shape, jnp.float32), jax.ShapeDtypeStruct(w.shape,
                                                                              jnp.float32))
    return tuple(jax.ffi.ffi_call(BACKWARD_TARGET, grads, vmap_method="sequential")(
        x2, w, rstd, dy.astype(jnp.float32)))


_norm.defvjp(_norm_fwd, _norm_bwd)


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel; True when the update step can use it.
    On a failure, one warning and False: the update step then keeps the model's norm."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "RMSNorm", "the update step uses XLA's norm")
