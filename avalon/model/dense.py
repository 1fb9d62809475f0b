"""Weight projections as one 2-D matmul: x [..., *in] with w [*in, *out] -> [..., *out].

`dense(x, w, n_in)` contracts the last `n_in` axes of x with the first `n_in` axes of w. It
equals `jnp.einsum` over those axes (the reference, `dense_einsum`), computed as
[tokens, prod(in)] @ [prod(in), prod(out)] when no multi-device mesh is active.

Why: for a matmul whose activations keep two leading axes ([b, t, d]), the weight gradient contracts
over both, and XLA:CPU (jax 0.10) lowers it as a transposed copy of the output gradient followed by
a matmul with a transposed operand, several times slower than the same product on flattened tokens
(the LM head's gradient at 8 x 512 tokens, width 256, vocab 4096: 1.78 s against 1.01 s for its
whole forward and backward, one core; `docs/results_history.md`, the update step against
transformers). Under a mesh the einsum is kept, so every axis keeps its sharding and the partitioner
sees the program it always saw.

A weight need not be an array: a platform backend (`avalon/backends/`) may hold a projection in
a layout of its own for decode, a `BackendWeight` that computes its own product (on CPU the
output-first `OutIn` and the C++ kernel's `Packed`). The model only knows the interface: such a
weight reads as the weight's own `shape` and `dtype`, gives its product with `product`, its
routed experts with `routed_experts`, and itself in the [in, out] layout with `as_in_out` (the
reference every backend layout is tested against).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp

from avalon import sharding

_LETTERS = "abcdefghijklmnopqrstuvwxyz"

# A platform backend's float32 product fn(x2 [m, k], w2 [k, n], transpose_w=False) -> [m, n]
# (with transpose_w, w2 is [n, k] and the product x2 @ w2.T), differentiable, which `dense`,
# `dense_head` and `tied_head` use while it is set (`platform_product`) and no mesh is active.
_PRODUCT: contextvars.ContextVar = contextvars.ContextVar("avalon_dense_product", default=None)


@contextlib.contextmanager
def platform_product(fn):
    """While tracing inside it, float32 products of array weights in `dense`, `dense_head` and
    `tied_head` are fn(x2, w2, transpose_w) (the update step's on CPU:
    `backends.training.products`); fn computes the same function (its backend's tests hold it
    to the plain product)."""
    token = _PRODUCT.set(fn)
    try:
        yield
    finally:
        _PRODUCT.reset(token)


def _platform_product(x2: jax.Array, w2: jax.Array, transpose_w: bool = False):
    """fn(x2, w2, transpose_w) when a platform product is set and both are float32, else
    None."""
    fn = _PRODUCT.get()
    if fn is None or x2.dtype != jnp.float32 or w2.dtype != jnp.float32:
        return None
    return fn(x2, w2, transpose_w)


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


def dense(x: jax.Array, w, n_in: int = 1) -> jax.Array:
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
    else:
        x2, w2 = x.reshape(-1, k), w.reshape(k, -1).astype(x.dtype)
        y = _platform_product(x2, w2)
        if y is None:
            y = x2 @ w2
    return y.reshape(*lead, *out)


def transposed(a: jax.Array) -> jax.Array:
    """a.T as its own array. The barrier stops XLA folding the transpose into the next dot: XLA:CPU
    runs a product whose left operand contracts its leading axis at 40-60 GFLOP/s against 80-88 for
    the same product on the transposed copy (one AVX2 core; docs/results_history.md, "The grouped
    MoE backend as a loop of 2-D products"), and the copy is one pass over the operand."""
    return jax.lax.optimization_barrier(a.T)


def dense_head(x: jax.Array, w) -> jax.Array:
    """`dense(x, w)` for an LM head (w [D, V], V >> D), whose weight gradient x2.T @ g is
    computed on a transposed copy of x2 [N, D]. XLA:CPU's product contracting the rows of the
    [N, V] logits' gradient in place runs at 31 GFLOP/s, on the copy at 59 (one AVX2 core,
    N = 4,096, D = 256, V = 4,096; docs/results_history.md, "Prefill without 2x padding, the LM
    head's gradient, YNNPACK dots in the update"); the copy is N x D, a sixteenth of
    the gradient. Under a mesh, or for a head held in a backend's layout, this is `dense`."""
    if isinstance(w, BackendWeight) or sharding.active_mesh() is not None:
        return dense(x, w)
    if x.shape[-1:] != w.shape[:1] or w.ndim != 2:
        raise ValueError(f"dense_head: x {x.shape} and w {w.shape} are not [..., D] and [D, V]")
    lead = x.shape[:-1]
    x2, w2 = x.reshape(-1, w.shape[0]), w.astype(x.dtype)
    y = _platform_product(x2, w2)
    return (_head_product(x2, w2) if y is None else y).reshape(*lead, -1)


def tied_head(x: jax.Array, embed: jax.Array) -> jax.Array:
    """`dense_head(x, embed.T)` for a tied LM head (embed [V, D]). With a platform product the
    embedding is used as it is stored (no [D, V] transposed copy of it, nor of its gradient,
    per step: 0.3 s of SmolLM2-135M's CPU update step); otherwise this is `dense_head`."""
    if embed.ndim == 2 and x.shape[-1:] == embed.shape[1:] and sharding.active_mesh() is None:
        y = _platform_product(x.reshape(-1, embed.shape[1]), embed.astype(x.dtype), True)
        if y is not None:
            return y.reshape(*x.shape[:-1], -1)
    return dense_head(x, embed.T.astype(x.dtype))


@jax.custom_vjp
def _head_product(x2, w):
    return x2 @ w


def _head_fwd(x2, w):
    return x2 @ w, (x2, w)


def _head_bwd(res, g):
    x2, w = res
    return g @ w.T, transposed(x2) @ g


_head_product.defvjp(_head_fwd, _head_bwd)
