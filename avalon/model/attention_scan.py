"""Causal attention as one `lax.scan` over the (query block, key block) pairs at or below the
diagonal, with a FlashAttention backward (`AttentionImpl.CAUSAL_SCAN`).

Why a scan over pairs: the query-chunked path computes every key for every query chunk (twice
the causal FLOPs); FLASH and BLOCK_CAUSAL skip the blocks above the diagonal with a Python loop
whose slices differ in length per block, so a 131K-token row unrolls hundreds of differently
shaped blocks. Here every step has the same shapes (one [block] x [block] tile per head), the
n (n + 1) / 2 pairs of n = t / block blocks are a static list (so the trip count is known to
XLA's and `experiments/scale/hlo_stats.py`'s loop accounting), and only the diagonal tiles do
masked work: the matmul FLOPs are the causal ones plus half of n diagonal tiles.

Forward: pairs run query-major (i = 0: j = 0; i = 1: j = 0, 1; ...). The carry is the online
softmax of the current query block (running max m, normaliser l, unnormalised output acc),
reset at j = 0; after every step the block's normalised output and log-sum-exp are written at
block i, so the last write (j = i) is the final one and no step needs a branch. Only q, k, v,
the output and the log-sum-exp are kept for the backward.

Backward (the FlashAttention recurrence): P = exp(S - lse) per tile, dV_j += P^T dO_i,
dS = P (dO_i V_j^T - D_i) with D = rowsum(dO O), dQ_i += dS K_j (carried, reset at j = 0,
written every step), dK_j += dS^T Q_i (accumulated in place in fp32).

Layout: q [b, t, h, g, d] (g query heads per kv head), k, v [b, t, h, d], seg [b, t]: the
contract of `attention._full_attention`. Masked scores use the finite fill of attention.py and
their probabilities are exactly zero, so a query block with nothing visible yet (an earlier
segment's keys) accumulates nothing; every real query sees itself at its diagonal tile.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

_MASKED = -1e30


def causal_scan_attention(q, k, v, seg, scale: float, block: int):
    """q [b, t, h, g, d]; k, v [b, t, h, d]; seg [b, t] -> [b, t, h, g, d]: causal attention
    within equal segment ids, blocks of `block` positions (t is padded up to a multiple)."""
    b, t, h, g, d = q.shape
    pad = (-t) % block
    if pad:
        q = jnp.pad(q, [(0, 0), (0, pad), (0, 0), (0, 0), (0, 0)])
        k = jnp.pad(k, [(0, 0), (0, pad), (0, 0), (0, 0)])
        v = jnp.pad(v, [(0, 0), (0, pad), (0, 0), (0, 0)])
        seg = jnp.pad(seg, [(0, 0), (0, pad)], constant_values=-1)
    n = (t + pad) // block
    # Blocks lead: [n, b, h, g, B, d] for queries, [n, b, h, B, d] for keys and values.
    qb = q.reshape(b, n, block, h, g, d).transpose(1, 0, 3, 4, 2, 5)
    kb = k.reshape(b, n, block, h, d).transpose(1, 0, 3, 2, 4)
    vb = v.reshape(b, n, block, h, d).transpose(1, 0, 3, 2, 4)
    sb = seg.reshape(b, n, block).swapaxes(0, 1)  # [n, b, B]
    out = _core(qb, kb, vb, sb, scale, n)
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(b, n * block, h, g, d)[:, :t]


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (i, j) block pairs with j <= i, query-major."""
    i, j = np.tril_indices(n)
    return i.astype(np.int32), j.astype(np.int32)


def _tile_mask(sb, i, j, block: int):
    """[b, 1, 1, B, B]: key position <= query position (only binds on the diagonal) and the
    same segment."""
    pos = jnp.arange(block)
    causal = (i * block + pos)[:, None] >= (j * block + pos)[None, :]
    same = sb[i][:, :, None] == sb[j][:, None, :]  # [b, B, B]
    return (causal[None] & same)[:, None, None]


def _scores(qi, kj, mask, scale):
    s = jnp.einsum("bhgqd,bhkd->bhgqk", qi, kj) * jnp.asarray(scale, qi.dtype)
    return jnp.where(mask, s.astype(jnp.float32), _MASKED)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _core(qb, kb, vb, sb, scale, n: int):
    return _forward(qb, kb, vb, sb, scale, n)[0]


def _forward(qb, kb, vb, sb, scale, n):
    _, b, h, g, block, d = qb.shape
    f32 = jnp.float32
    pi, pj = _pairs(n)

    def step(carry, ij):
        m, l, acc, out, lse = carry
        i, j = ij
        first = j == 0
        m = jnp.where(first, _MASKED, m)
        l = jnp.where(first, 0.0, l)
        acc = jnp.where(first, 0.0, acc)
        mask = _tile_mask(sb, i, j, block)
        s = _scores(qb[i], kb[j], mask, scale)  # [b, h, g, B, B]
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(axis=-1)
        pv = jnp.einsum("bhgqk,bhkd->bhgqd", p.astype(vb.dtype), vb[j]).astype(f32)
        acc = acc * corr[..., None] + pv
        safe = jnp.maximum(l, jnp.finfo(f32).tiny)
        out = jax.lax.dynamic_update_index_in_dim(
            out, (acc / safe[..., None]).astype(out.dtype), i, 0)
        lse = jax.lax.dynamic_update_index_in_dim(lse, m_new + jnp.log(safe), i, 0)
        return (m_new, l, acc, out, lse), None

    init = (jnp.full((b, h, g, block), _MASKED, f32), jnp.zeros((b, h, g, block), f32),
            jnp.zeros((b, h, g, block, d), f32), jnp.zeros(qb.shape, vb.dtype),
            jnp.zeros((n, b, h, g, block), f32))
    (_, _, _, out, lse), _ = jax.lax.scan(step, init, (jnp.asarray(pi), jnp.asarray(pj)))
    return out, (qb, kb, vb, sb, out, lse)


def _backward(scale, n, res, dout):
    qb, kb, vb, sb, out, lse = res
    _, b, h, g, block, d = qb.shape
    f32 = jnp.float32
    d_row = jnp.sum(dout.astype(f32) * out.astype(f32), axis=-1)  # [n, b, h, g, B]
    pi, pj = _pairs(n)

    def step(carry, ij):
        dq_acc, dq, dk, dv = carry
        i, j = ij
        dq_acc = jnp.where(j == 0, 0.0, dq_acc)
        mask = _tile_mask(sb, i, j, block)
        qi, kj, vj, do_i = qb[i], kb[j], vb[j], dout[i]
        s = _scores(qi, kj, mask, scale)
        p = jnp.where(mask, jnp.exp(s - lse[i][..., None]), 0.0)
        dv_j = jnp.einsum("bhgqk,bhgqd->bhkd", p.astype(do_i.dtype), do_i).astype(f32)
        dp = jnp.einsum("bhgqd,bhkd->bhgqk", do_i, vj).astype(f32)
        ds = (p * (dp - d_row[i][..., None]) * scale).astype(qi.dtype)
        dq_acc = dq_acc + jnp.einsum("bhgqk,bhkd->bhgqd", ds, kj).astype(f32)
        dk_j = jnp.einsum("bhgqk,bhgqd->bhkd", ds, qi).astype(f32)
        dq = jax.lax.dynamic_update_index_in_dim(dq, dq_acc.astype(dq.dtype), i, 0)
        dk = jax.lax.dynamic_update_index_in_dim(
            dk, jax.lax.dynamic_index_in_dim(dk, j, 0, False) + dk_j, j, 0)
        dv = jax.lax.dynamic_update_index_in_dim(
            dv, jax.lax.dynamic_index_in_dim(dv, j, 0, False) + dv_j, j, 0)
        return (dq_acc, dq, dk, dv), None

    init = (jnp.zeros((b, h, g, block, d), f32), jnp.zeros(qb.shape, qb.dtype),
            jnp.zeros(kb.shape, f32), jnp.zeros(vb.shape, f32))
    (_, dq, dk, dv), _ = jax.lax.scan(step, init, (jnp.asarray(pi), jnp.asarray(pj)))
    return dq, dk.astype(kb.dtype), dv.astype(vb.dtype), None


_core.defvjp(_forward, _backward)
