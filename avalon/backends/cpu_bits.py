"""Moving 16-bit floats as their bit patterns, on CPU.

Why: XLA:CPU has no bf16 gather or scatter. It lowers one by widening the whole operand to fp32
and narrowing the result back, so a gather of a few rows of a bf16 table, or a write into a bf16
page pool, costs passes over the whole array: SmolLM2's bf16 decode at batch 32 spent more time
widening and narrowing its KV pools and embedding table than in its products (88 tokens/s). A
gather or scatter only copies values, so doing it on the uint16 bit patterns gives the same
values (a bitcast between types of one width is exact). Other platforms gather and scatter bf16
natively, and there the bitcasts cost (the pod's TPU decode compiled with a bits pool took
268 MB more temporary memory per chip), so only the CPU's ops use these: the engine's pool is
stored as bits (`storage_dtype`; the model's reads and writes follow the pool's own dtype) and
the embedding lookup gathers bits (`take_rows`, `Ops.take_rows`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def storage_dtype(dtype, platform: str) -> jnp.dtype:
    """How a page pool of `dtype` values is stored on `platform`: on CPU a 16-bit float as its
    bit patterns (uint16), otherwise as itself."""
    dtype = jnp.dtype(dtype)
    if platform == "cpu" and dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating):
        return jnp.dtype(jnp.uint16)
    return dtype


def take_rows(table: jax.Array, idx: jax.Array) -> jax.Array:
    """jnp.take(table, idx, axis=0), a 16-bit float table's rows gathered as bits (the
    gradient is jnp.take's either way)."""
    if table.dtype.itemsize != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        return jnp.take(table, idx, axis=0)
    return _take_rows_as_bits(table, idx)


@jax.custom_vjp
def _take_rows_as_bits(table: jax.Array, idx: jax.Array) -> jax.Array:
    got = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), idx, axis=0)
    return jax.lax.bitcast_convert_type(got, table.dtype)


def _take_rows_fwd(table, idx):
    return _take_rows_as_bits(table, idx), (idx, jnp.zeros((0,) + table.shape[1:], table.dtype),
                                            table.shape[0])


def _take_rows_bwd(res, g):
    idx, like, rows = res
    grad = jnp.zeros((rows,) + like.shape[1:], like.dtype).at[idx].add(g.astype(like.dtype))
    return grad, None


_take_rows_as_bits.defvjp(_take_rows_fwd, _take_rows_bwd)
