"""Mamba-2 state-space duality (SSD): the chunked scan, its sequential reference, one decode step.

The recurrence, per head h with state S[h] in R^{P x N} and head h reading group g(h) = h // (H/G):

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t (outer) B_t          y_t = S_t C_t + D x_t

Inputs (after the conv, softplus and dt clamp): x [b, t, H, P], dt [b, t, H], A [H] (negative),
B, C [b, t, G, N], D [H], optional initial state h0 [b, H, P, N]. Everything here runs in the
dtype it is given (fp32 in the model, fp64 in exactness tests).

Packed sequences: `segment_ids` [b, t] (contiguous runs; a change of id starts a new sequence)
reset the state at every segment start, exactly as if each segment were run alone. The chunked
scan does this with masks rather than by forcing decays to -inf, so no -inf - -inf appears and the
gradient stays finite. The initial state belongs to the first segment of each row.

Notation in einsums: b batch, c chunk, l/s positions within a chunk (target/source), g B/C
group, r head within its group (H = G * R), p head dim, n state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _split_heads(x, dt, A, D, groups: int):
    b, t, h = dt.shape
    r = h // groups
    xs = None if x is None else x.reshape(b, t, groups, r, x.shape[-1])
    return xs, dt.reshape(b, t, groups, r), A.reshape(groups, r), D.reshape(groups, r)


def ssd_sequential(x, dt, A, B, C, D, h0=None, segment_ids=None):
    """Reference: a `lax.scan` over time. Returns (y [b, t, H, P], final state [b, H, P, N])."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    xs, dts, As, Ds = _split_heads(x, dt, A, D, g)
    state = jnp.zeros((b, g, h // g, p, n), x.dtype) if h0 is None \
        else h0.reshape(b, g, h // g, p, n).astype(x.dtype)
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids
    reset = jnp.concatenate([jnp.zeros((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)

    def step(s, inp):
        x_t, dt_t, b_t, c_t, reset_t = inp
        decay = jnp.exp(dt_t * As)  # [b, g, r]
        decay = jnp.where(reset_t[:, None, None], 0.0, decay)
        s = s * decay[..., None, None] + jnp.einsum("bgr,bgrp,bgn->bgrpn", dt_t, x_t, b_t)
        y_t = jnp.einsum("bgrpn,bgn->bgrp", s, c_t) + Ds[..., None] * x_t
        return s, y_t

    inputs = (xs.swapaxes(0, 1), dts.swapaxes(0, 1), B.swapaxes(0, 1), C.swapaxes(0, 1),
              reset.swapaxes(0, 1))
    state, ys = jax.lax.scan(step, state, inputs)
    return ys.swapaxes(0, 1).reshape(b, t, h, p), state.reshape(b, h, p, n)


def ssd_step(state, x, dt, A, B, C, D):
    """One recurrent decode step. state [b, H, P, N]; x [b, H, P]; dt [b, H]; B, C [b, G, N].
    Returns (y [b, H, P], new state)."""
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    r = h // g
    xs = x.reshape(b, g, r, p)
    s = state.reshape(b, g, r, p, n)
    dts = dt.reshape(b, g, r)
    decay = jnp.exp(dts * A.reshape(g, r))
    s = s * decay[..., None, None] + jnp.einsum("bgr,bgrp,bgn->bgrpn", dts, xs, B)
    y = jnp.einsum("bgrpn,bgn->bgrp", s, C) + D.reshape(g, r)[..., None] * xs
    return y.reshape(b, h, p), s.reshape(b, h, p, n)


def segsum(a):
    """out[..., l, s] = sum_{k=s+1..l} a[..., k] for s <= l, -inf above the diagonal.

    Built by masking, then summing down the rows with a lower-triangular matrix of ones (never
    cumsum differences), so no large terms cancel and exp(out) is exactly 0 above the diagonal
    with a finite gradient. The sum is one matmul per chunk (at full fp32 precision, also on
    TPU): XLA:CPU lowers the cumulative sum of `segsum_cumsum`, the reference, as a tree of
    reduce-windows, slower than this product (docs/results_history.md, "Update step against
    transformers, second round")."""
    q = a.shape[-1]
    x = jnp.where(jnp.tril(jnp.ones((q, q), bool), -1), a[..., :, None], 0.0)  # x[.., k, s]
    ones = jnp.tril(jnp.ones((q, q), a.dtype))  # ones[l, k] = 1 for k <= l
    cs = jnp.einsum("lk,...ks->...ls", ones, x, precision=jax.lax.Precision.HIGHEST)
    return jnp.where(jnp.tril(jnp.ones((q, q), bool)), cs, -jnp.inf)


def segsum_cumsum(a):
    """`segsum` as a masked cumulative sum (the reference)."""
    q = a.shape[-1]
    x = jnp.broadcast_to(a[..., :, None], (*a.shape, q))  # x[..., l, s] = a[l]
    strict = jnp.tril(jnp.ones((q, q), bool), -1)
    x = jnp.where(strict, x, 0.0)
    cs = jnp.cumsum(x, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((q, q), bool)), cs, -jnp.inf)


def ssd_chunked(x, dt, A, B, C, D, chunk_size: int, h0=None, segment_ids=None):
    """The chunked SSD (quadratic within a chunk, linear across chunks).

    Returns (y [b, t, H, P], final state [b, H, P, N]). Equal to `ssd_sequential`."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    q = chunk_size
    pad = (-t) % q
    c = (t + pad) // q
    dtype = x.dtype

    def chunked(z, fill=0.0):
        z = jnp.pad(z, [(0, 0), (0, pad)] + [(0, 0)] * (z.ndim - 2), constant_values=fill)
        return z.reshape(b, c, q, *z.shape[2:])

    xs, dts, As, Ds = _split_heads(x, dt, A, D, g)
    X = chunked(xs * dts[..., None])  # [b, c, l, g, r, p]: x discretised by dt
    a = chunked(dts * As)  # [b, c, l, g, r]; zero on padding, so padding leaves state alone
    Bc, Cc = chunked(B), chunked(C)  # [b, c, l, g, n]
    a = jnp.moveaxis(a, 2, -1)  # [b, c, g, r, l]
    a_cs = jnp.cumsum(a, axis=-1)

    if segment_ids is not None:
        seg = jnp.pad(segment_ids, [(0, 0), (0, pad)], mode="edge").reshape(b, c, q)
        last = seg[:, :, -1]  # segment owning each chunk's end state
        seg_in = jnp.concatenate([seg[:, :1, 0], last[:, :-1]], axis=1)  # state entering chunk
        same = seg[:, :, :, None] == seg[:, :, None, :]  # [b, c, l, s]
        in_last = (seg == last[..., None]).astype(dtype)  # tokens feeding the end state
        from_in = (seg == seg_in[..., None]).astype(dtype)  # tokens that see the entering state
        keep = jnp.all(seg == seg_in[..., None], axis=-1).astype(dtype)  # [b, c]

    # 1. Within each chunk: an attention-like masked product.
    L = jnp.exp(segsum(a))  # [b, c, g, r, l, s]
    if segment_ids is not None:
        L = L * same[:, :, None, None].astype(dtype)
    CB = jnp.einsum("bclgn,bcsgn->bcgls", Cc, Bc)
    y_diag = jnp.einsum("bcgls,bcgrls,bcsgrp->bclgrp", CB, L, X)

    # 2. The state each chunk contributes at its end.
    decay_to_end = jnp.exp(a_cs[..., -1:] - a_cs)  # [b, c, g, r, l]
    if segment_ids is not None:
        decay_to_end = decay_to_end * in_last[:, :, None, None, :]
    states = jnp.einsum("bclgn,bcgrl,bclgrp->bcgrpn", Bc, decay_to_end, X)

    # 3. Across chunks: S_end[c] = keep[c] * exp(sum a over c) * S_end[c-1] + states[c].
    chunk_decay = jnp.exp(a_cs[..., -1])  # [b, c, g, r]
    if segment_ids is not None:
        chunk_decay = chunk_decay * keep[:, :, None, None]

    def combine(left, right):
        d1, s1 = left
        d2, s2 = right
        return d1 * d2, d2[..., None, None] * s1 + s2

    cum_decay, ends = jax.lax.associative_scan(combine, (chunk_decay, states), axis=1)
    init = jnp.zeros((b, g, r, p, n), dtype) if h0 is None \
        else h0.reshape(b, g, r, p, n).astype(dtype)
    ends = ends + cum_decay[..., None, None] * init[:, None]
    starts = jnp.concatenate([init[:, None], ends[:, :-1]], axis=1)  # [b, c, g, r, p, n]

    # 4. Each position reads the state entering its chunk.
    decay_from_start = jnp.exp(a_cs)  # [b, c, g, r, l]
    if segment_ids is not None:
        decay_from_start = decay_from_start * from_in[:, :, None, None, :]
    y_off = jnp.einsum("bclgn,bcgrpn,bcgrl->bclgrp", Cc, starts, decay_from_start)

    y = (y_diag + y_off).reshape(b, c * q, g, r, p)[:, :t]
    y = y + Ds[..., None] * xs
    return y.reshape(b, t, h, p), ends[:, -1].reshape(b, h, p, n)
