"""The dense MLP's SwiGLU activation for training on CPU: a C++ kernel (forward and backward)
behind XLA's FFI, the model's silu(gate) * up in the update step (`Ops.swiglu`).

XLA:CPU runs it as three passes over memory forward (autodiff keeps the sigmoid and silu for the
backward) and two backward (~0.25 s of SmolLM2-135M's update step on one core;
`experiments/bench/RESULTS.md`, "SmolLM2's update step against transformers on one core");
`cpu_swiglu.cc` makes one pass each way from gate and up. Same function and gradients, equal to
rounding: tests/backends/test_cpu_layer_kernels.py. fp32; the update step uses it on a CPU with one
device (`training.TrainingPlatform`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from avalon.backends import cpu_build

SOURCE = Path(__file__).with_suffix(".cc")
FORWARD_TARGET = "avalon_swiglu_fwd"
BACKWARD_TARGET = "avalon_swiglu_bwd"
_SYMBOLS = {FORWARD_TARGET: "AvalonSwigluForward", BACKWARD_TARGET: "AvalonSwigluBackward"}


def _check(gate, up):
    if gate.shape != up.shape or gate.dtype != jnp.float32 or up.dtype != jnp.float32:
        raise ValueError(f"cpu_swiglu: gate {gate.shape} {gate.dtype} and up {up.shape} "
                         f"{up.dtype} must be float32 of one shape")


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """jax.nn.silu(gate) * up for fp32 gate and up of one shape, on the kernel (`ready()`
    must be True)."""
    _check(gate, up)
    return jax.ffi.ffi_call(FORWARD_TARGET, jax.ShapeDtypeStruct(gate.shape, jnp.float32),
                            vmap_method="sequential")(gate, up)


def _swiglu_fwd(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(res, dh):
    gate, up = res
    out = (jax.ShapeDtypeStruct(gate.shape, jnp.float32),) * 2
    return tuple(jax.ffi.ffi_call(BACKWARD_TARGET, out, vmap_method="sequential")(
        gate, up, dh.astype(jnp.float32)))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel; True when the update step can use it.
    On a failure, one warning and False: the update step then keeps the model's activation."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "SwiGLU", "the update step uses XLA's activation")
