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
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from avalon import sharding

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def dense_einsum(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """The reference: the same contraction as one einsum."""
    lead = x.ndim - n_in
    xs = _LETTERS[:x.ndim]
    ws = xs[lead:] + _LETTERS[x.ndim:x.ndim + w.ndim - n_in]
    return jnp.einsum(f"{xs},{ws}->{xs[:lead]}{ws[n_in:]}", x, w.astype(x.dtype))


def dense(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """x [..., *w.shape[:n_in]] @ w -> [..., *w.shape[n_in:]] (w cast to x's dtype)."""
    if x.shape[x.ndim - n_in:] != w.shape[:n_in]:
        raise ValueError(f"dense: x {x.shape} does not end with the {n_in} input axes of "
                         f"w {w.shape}")
    active = sharding.active()
    if active is not None and active[0].size > 1:
        return dense_einsum(x, w, n_in)
    lead, out = x.shape[:x.ndim - n_in], w.shape[n_in:]
    k = math.prod(w.shape[:n_in])
    y = x.reshape(-1, k) @ w.reshape(k, -1).astype(x.dtype)
    return y.reshape(*lead, *out)
