"""Platform kernels for the model's elementwise layers, set while tracing.

A platform backend may compute `rms_norm` (fn(x, w, eps), `model.norms`) and the dense MLP's
`swiglu` (fn(gate, up) = silu(gate) * up, `model.mlp`) with kernels of its own, differentiable,
the same functions (its tests hold them to the model's). The update step on a one-device CPU
traces under `use(...)` (`backends.training.layer_kernels`); the model imports nothing from the
backends. As `dense.platform_product`: applied to float32 arrays only, and never under a mesh.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax.numpy as jnp

from avalon import sharding

NAMES = ("rms_norm", "swiglu")
_KERNELS: contextvars.ContextVar = contextvars.ContextVar("avalon_layer_kernels", default=None)


@contextlib.contextmanager
def use(**fns):
    """While tracing inside it, the named layers (NAMES) run on these fns."""
    unknown = set(fns) - set(NAMES)
    if unknown:
        raise ValueError(f"model.kernels.use: unknown kernel(s) {sorted(unknown)}; known: "
                         f"{list(NAMES)}")
    token = _KERNELS.set({**(_KERNELS.get() or {}), **fns})
    try:
        yield
    finally:
        _KERNELS.reset(token)


def get(name: str, *arrays):
    """The kernel set for `name` when every array is float32 and no mesh is active, else
    None."""
    fn = (_KERNELS.get() or {}).get(name)
    if fn is None or sharding.active_mesh() is not None:
        return None
    return fn if all(a.dtype == jnp.float32 for a in arrays) else None
