"""Weight projections: x [..., *in] with w [*in, *out] -> [..., *out].

`dense(x, w, n_in)` contracts the last `n_in` axes of x with the first `n_in` axes of w, as one
einsum (`dense_einsum`). A caller may pass a platform's product of flattened tokens
(`ops.Ops.product`: [tokens, prod(in)] @ [prod(in), prod(out)]), which the model then uses when
no multi-device mesh is active: under a mesh the einsum is kept, so every axis keeps its sharding
and the partitioner sees the program it always saw.

A weight need not be an array: a platform backend (`avalon/backends/`) may hold a projection in
a layout of its own for decode, a `BackendWeight` that computes its own product (on CPU the
output-first `OutIn` and the C++ kernel's `Packed`). The model only knows the interface: such a
weight reads as the weight's own `shape` and `dtype`, gives its product with `product`, its
routed experts with `routed_experts`, and itself in the [in, out] layout with `as_in_out` (the
reference every backend layout is tested against).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from avalon import sharding
from avalon.model.ops import PLAIN, Ops

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class BackendWeight:
    """A projection weight w [*lead, *in, *out] held in a platform backend's layout (the engine's
    decode layouts, `avalon/backends/`). Subclasses are pytrees whose `shape` and `dtype` read
    as w's own, so the layers' shape checks and casts are written once for arrays and these.

    `product(x2)`: x2 [rows, prod(in)] @ w -> [rows, prod(out)], in x2's dtype.
    `routed_experts(xl, idx, down, act)`: the routed experts' per-choice outputs [n, k, w] for
    expert weights (this the fused up weight, `down` the down weight in the same layout), as
    `moe._experts_grouped` computes them; forward only.
    `as_in_out()`: w itself [*lead, *in, *out] (a copy; the reference)."""

    shape: tuple
    dtype: object

    def astype(self, dtype) -> BackendWeight:
        raise NotImplementedError

    def product(self, x2: jax.Array) -> jax.Array:
        raise NotImplementedError

    def routed_experts(self, xl, idx, down, act) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__} holds no routed experts")

    def as_in_out(self) -> jax.Array:
        raise NotImplementedError


def dense_einsum(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """The reference: the same contraction as one einsum."""
    if isinstance(w, BackendWeight):
        w = w.as_in_out()
    lead = x.ndim - n_in
    xs = _LETTERS[:x.ndim]
    ws = xs[lead:] + _LETTERS[x.ndim:x.ndim + w.ndim - n_in]
    return jnp.einsum(f"{xs},{ws}->{xs[:lead]}{ws[n_in:]}", x, w.astype(x.dtype))


def dense(x: jax.Array, w, n_in: int = 1, ops: Ops = PLAIN) -> jax.Array:
    """x [..., *w.shape[:n_in]] @ w -> [..., *w.shape[n_in:]] (w cast to x's dtype; w an array
    or a `BackendWeight`, which computes its own product)."""
    if x.shape[x.ndim - n_in:] != w.shape[:n_in]:
        raise ValueError(f"dense: x {x.shape} does not end with the {n_in} input axes of "
                         f"w {w.shape}")
    if sharding.active_mesh() is not None:
        return dense_einsum(x, w, n_in)
    lead, out = x.shape[:x.ndim - n_in], w.shape[n_in:]
    k = math.prod(w.shape[:n_in])
    if isinstance(w, BackendWeight):
        y = w.product(x.reshape(-1, k))
    elif ops.product is not None:
        y = ops.product(x.reshape(-1, k), w.reshape(k, -1).astype(x.dtype))
    else:
        return dense_einsum(x, w, n_in)
    return y.reshape(*lead, *out)


def dense_head(x: jax.Array, w, ops: Ops = PLAIN) -> jax.Array:
    """`dense(x, w)` for an LM head (w [D, V], V >> D), on the platform's head product where
    one is given (`Ops.head_product`). Under a mesh, or for a head held in a backend's layout,
    this is `dense`."""
    if (isinstance(w, BackendWeight) or sharding.active_mesh() is not None
            or ops.head_product is None):
        return dense(x, w, ops=ops)
    if x.shape[-1:] != w.shape[:1] or w.ndim != 2:
        raise ValueError(f"dense_head: x {x.shape} and w {w.shape} are not [..., D] and [D, V]")
    y = ops.head_product(x.reshape(-1, w.shape[0]), w.astype(x.dtype))
    return y.reshape(*x.shape[:-1], -1)


def tied_head(x: jax.Array, embed: jax.Array, ops: Ops = PLAIN) -> jax.Array:
    """`dense_head(x, embed.T)` for a tied LM head (embed [V, D]). With a platform head product
    the embedding is used as it is stored (`transpose_w`: no [D, V] transposed copy of it, nor
    of its gradient, per step)."""
    if (ops.head_product is not None and embed.ndim == 2 and x.shape[-1:] == embed.shape[1:]
            and sharding.active_mesh() is None):
        y = ops.head_product(x.reshape(-1, embed.shape[1]), embed.astype(x.dtype), True)
        return y.reshape(*x.shape[:-1], -1)
    return dense_head(x, embed.T.astype(x.dtype), ops)
