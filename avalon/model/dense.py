"""Weight projections as one 2-D matmul: x [..., *in] with w [*in, *out] -> [..., *out].

`dense(x, w, n_in)` contracts the last `n_in` axes of x with the first `n_in` axes of w. It
equals `jnp.einsum` over those axes (the reference, `dense_einsum`), computed as
[tokens, prod(in)] @ [prod(in), prod(out)] when no multi-device mesh is active.

Why: for a matmul whose activations keep two leading axes ([b, t, d]), the weight gradient
contracts over both, and XLA:CPU (jax 0.10) lowers it as a transposed copy of the output
gradient followed by a matmul with a transposed operand, several times slower than the same
product on flattened tokens (the LM head's gradient at 8 x 512 tokens, width 256, vocab
4096: 1.78 s against 1.01 s for its whole forward and backward, one core;
`experiments/bench/RESULTS.md`, issue 22). Under a mesh the einsum is kept, so every axis
keeps its sharding and the partitioner sees the program it always saw.

`OutIn` holds a weight with its output axes first, as the engine decodes from it on CPU: with
few token rows (decode), XLA:CPU streams a weight from memory at ~1.8x the rate when the product
is computed as w_t [out, in] @ x.T (the weight's rows are the product's long axis) than as x @ w
with w [in, out] (one AVX2 core, [8, 256] against 64 MB of [256, 4096] weights: 5.3 against
2.9 GB/s; `experiments/bench/RESULTS.md`, issue 22). Many rows take x @ w_t.T instead.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from avalon import sharding
from avalon.model.cpu_gemm import Packed, rows_product

_LETTERS = "abcdefghijklmnopqrstuvwxyz"

# Up to this many token rows a product with an `OutIn` weight runs as w_t @ x.T (decode).
OUT_IN_ROWS = 64


@jax.tree_util.register_pytree_node_class
class OutIn:
    """A projection weight w [*in, *out] held as t [..., prod(out), prod(in)]: output axes first,
    flattened to one matrix. Leading axes (a layer stack's) stay in front of t and come off by
    indexing the pytree (`jax.tree.map(lambda a: a[0], ...)`), as for any other leaf. `shape`
    and `dtype` read as the weight's own, so call sites written for w work unchanged."""

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


def dense_einsum(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """The reference: the same contraction as one einsum."""
    if isinstance(w, (OutIn, Packed)):
        w = w.as_in_out()
    lead = x.ndim - n_in
    xs = _LETTERS[:x.ndim]
    ws = xs[lead:] + _LETTERS[x.ndim:x.ndim + w.ndim - n_in]
    return jnp.einsum(f"{xs},{ws}->{xs[:lead]}{ws[n_in:]}", x, w.astype(x.dtype))


def dense(x: jax.Array, w, n_in: int = 1) -> jax.Array:
    """x [..., *w.shape[:n_in]] @ w -> [..., *w.shape[n_in:]] (w cast to x's dtype; w an array,
    an `OutIn`, or a `cpu_gemm.Packed`, whose product runs on the CPU kernel)."""
    if x.shape[x.ndim - n_in:] != w.shape[:n_in]:
        raise ValueError(f"dense: x {x.shape} does not end with the {n_in} input axes of "
                         f"w {w.shape}")
    if sharding.active_mesh() is not None:
        return dense_einsum(x, w, n_in)
    lead, out = x.shape[:x.ndim - n_in], w.shape[n_in:]
    k = math.prod(w.shape[:n_in])
    if isinstance(w, OutIn):
        y = out_in_product(x.reshape(-1, k), w.t.astype(x.dtype))
    elif isinstance(w, Packed):
        y = rows_product(x.reshape(-1, k), w)
    else:
        y = x.reshape(-1, k) @ w.reshape(k, -1).astype(x.dtype)
    return y.reshape(*lead, *out)


def transposed(a: jax.Array) -> jax.Array:
    """a.T as its own array. The barrier stops XLA folding the transpose into the next dot:
    XLA:CPU runs a product whose left operand contracts its leading axis at 40-60 GFLOP/s
    against 80-88 for the same product on the transposed copy (one AVX2 core; RESULTS.md,
    issue 22), and the copy is one pass over the operand."""
    return jax.lax.optimization_barrier(a.T)


def dense_head(x: jax.Array, w) -> jax.Array:
    """`dense(x, w)` for an LM head (w [D, V], V >> D), whose weight gradient x2.T @ g is
    computed on a transposed copy of x2 [N, D]. XLA:CPU's product contracting the rows of the
    [N, V] logits' gradient in place runs at 31 GFLOP/s, on the copy at 59 (one AVX2 core,
    N = 4,096, D = 256, V = 4,096; RESULTS.md, issue 22); the copy is N x D, a sixteenth of
    the gradient. Under a mesh, or for an output-first or packed head, this is `dense`."""
    if isinstance(w, (OutIn, Packed)) or sharding.active_mesh() is not None:
        return dense(x, w)
    if x.shape[-1:] != w.shape[:1] or w.ndim != 2:
        raise ValueError(f"dense_head: x {x.shape} and w {w.shape} are not [..., D] and [D, V]")
    lead = x.shape[:-1]
    return _head_product(x.reshape(-1, w.shape[0]), w.astype(x.dtype)).reshape(*lead, -1)


@jax.custom_vjp
def _head_product(x2, w):
    return x2 @ w


def _head_fwd(x2, w):
    return x2 @ w, (x2, w)


def _head_bwd(res, g):
    x2, w = res
    return g @ w.T, transposed(x2) @ g


_head_product.defvjp(_head_fwd, _head_bwd)
