"""Projection weights held output-first (`OutIn`): the engine's decode layout on CPU when the
C++ kernel is not used (a bf16 decode view, or no compiler).

With few token rows (decode), XLA:CPU streams a weight from memory at ~1.8x the rate when the
product is computed as w_t [out, in] @ x.T (the weight's rows are the product's long axis) than as x
@ w with w [in, out] (one AVX2 core, [8, 256] against 64 MB of [256, 4096] weights: 5.3 against 2.9
GB/s; `docs/results_history.md`, "Decode weights held output-first"). Many rows take x @ w_t.T
instead.

The routed experts in this layout run the grouped dispatch's tiles (`moe._experts_grouped`),
each product as `out_in_product`: forward only (the engine does not differentiate).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from avalon.model.activations import activate
from avalon.model.config import Activation
from avalon.model.dense import BackendWeight
from avalon.model.moe import grouped_maps, grouped_plan, tile_rows, with_zero_row

# Up to this many token rows a product with an `OutIn` weight runs as w_t @ x.T (decode).
OUT_IN_ROWS = 64


@jax.tree_util.register_pytree_node_class
class OutIn(BackendWeight):
    """A projection weight w [*in, *out] held as t [..., prod(out), prod(in)]: output axes first,
    flattened to one matrix. Leading axes (a layer stack's, the experts') stay in front of t and
    come off by indexing the pytree (`jax.tree.map(lambda a: a[0], ...)`), as for any other
    leaf. `shape` and `dtype` read as the weight's own (`model.dense.BackendWeight`)."""

    def __init__(self, t: jax.Array, in_shape: tuple, out_shape: tuple):
        self.t, self.in_shape, self.out_shape = t, tuple(in_shape), tuple(out_shape)

    @classmethod
    def of(cls, w: jax.Array, n_in: int, lead: int = 0) -> OutIn:
        """w [*lead, *in, *out] -> OutIn (one transposed copy)."""
        in_shape = w.shape[lead:lead + n_in]
        out_shape = w.shape[lead + n_in:]
        flat = w.reshape(*w.shape[:lead], math.prod(in_shape), math.prod(out_shape))
        return cls(jnp.swapaxes(flat, -1, -2), in_shape, out_shape)

    @property
    def shape(self) -> tuple:
        return (*self.t.shape[:-2], *self.in_shape, *self.out_shape)

    @property
    def dtype(self):
        return self.t.dtype

    def astype(self, dtype) -> OutIn:
        return OutIn(self.t.astype(dtype), self.in_shape, self.out_shape)

    def as_in_out(self) -> jax.Array:
        """The weight in its own layout [*in, *out] (a transposed copy)."""
        return jnp.swapaxes(self.t, -1, -2).reshape(self.shape)

    def product(self, x2: jax.Array) -> jax.Array:
        return out_in_product(x2, self.t.astype(x2.dtype))

    def routed_experts(self, xl, idx, down: OutIn, act=Activation.RELU2) -> jax.Array:
        return experts_grouped_out_in(xl, idx, self.t, down.t, act)

    def tree_flatten(self):
        return (self.t,), (self.in_shape, self.out_shape)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)


def out_in_product(x2: jax.Array, t: jax.Array) -> jax.Array:
    """x2 [rows, in] with t [out, in] -> [rows, out]. The barrier keeps the product's output
    [out, rows] (XLA would otherwise fold the transpose into the dot, back to x2-major rows)."""
    if x2.shape[0] <= OUT_IN_ROWS:
        return jax.lax.optimization_barrier(t @ x2.T).T
    return x2 @ t.T


def experts_grouped_out_in(xl, idx, up_t, down_t, act=Activation.RELU2):
    """The grouped dispatch's forward on expert weights held output-first (up_t [E, f, w],
    down_t [E, w, f]): the same tiles as `moe._experts_grouped`, each product as
    `out_in_product`. xl [n, w], idx [n, k] -> per-choice outputs [n, k, w]."""
    n, k = idx.shape
    w = xl.shape[1]
    tile, order, slot_sorted, tile_expert, used = grouped_plan(idx, up_t.shape[0])
    tiles = tile_expert.shape[0]
    slot, src = grouped_maps(order, slot_sorted, tiles * tile)
    rows_in = with_zero_row(xl)

    def one_tile(i, y):
        e = tile_expert[i]
        buf = jnp.take(rows_in, tile_rows(src, i, tile) // k, axis=0)
        h = activate(act, out_in_product(buf, up_t[e]))
        return jax.lax.dynamic_update_slice_in_dim(y, out_in_product(h, down_t[e]), i * tile, 0)

    y = jax.lax.fori_loop(0, used, one_tile, jnp.zeros((tiles * tile, w), xl.dtype))
    return jnp.take(y, slot, axis=0).reshape(n, k, w)
