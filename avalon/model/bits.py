"""Moving 16-bit floats as their bit patterns.

Why: XLA:CPU has no bf16 gather or scatter. It lowers one by widening the whole operand to fp32
and narrowing the result back, so a gather of a few rows of a bf16 table, or a write into a bf16
page pool, costs passes over the whole array: SmolLM2's bf16 decode at batch 32 spent more time
widening and narrowing its KV pools and embedding table than in its products (88 tokens/s;
experiments/bench/RESULTS.md, topic 7). A gather or scatter only copies values, so doing it on
the uint16 bit patterns gives the same values, and a bitcast between types of one width is exact
on every platform.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def storage_dtype(dtype) -> jnp.dtype:
    """How an array of `dtype` values that is only moved (a page pool) is stored: a 16-bit float
    as its bit patterns (uint16), any other type as itself."""
    dtype = jnp.dtype(dtype)
    if dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating):
        return jnp.dtype(jnp.uint16)
    return dtype


def to_storage(values: jax.Array, dtype) -> jax.Array:
    """`values` cast to `dtype`, as `storage_dtype(dtype)` holds them."""
    values = values.astype(dtype)
    stored = storage_dtype(dtype)
    return values if stored == values.dtype else jax.lax.bitcast_convert_type(values, stored)


def from_storage(stored: jax.Array, dtype) -> jax.Array:
    """`to_storage`'s inverse: stored contents as `dtype` values."""
    dtype = jnp.dtype(dtype)
    return stored if stored.dtype == dtype else jax.lax.bitcast_convert_type(stored, dtype)


@jax.custom_vjp
def take_rows(table: jax.Array, idx: jax.Array) -> jax.Array:
    """jnp.take(table, idx, axis=0), gathered through the bit patterns of a 16-bit table; the
    gradient is jnp.take's (the cotangent added into the rows taken)."""
    got = jnp.take(to_storage(table, table.dtype), idx, axis=0)
    return from_storage(got, table.dtype)


def _take_rows_fwd(table, idx):
    return take_rows(table, idx), (idx, jnp.zeros((0,) + table.shape[1:], table.dtype),
                                   table.shape[0])


def _take_rows_bwd(res, g):
    idx, like, rows = res
    grad = jnp.zeros((rows,) + like.shape[1:], like.dtype).at[idx].add(g.astype(like.dtype))
    return grad, None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)
