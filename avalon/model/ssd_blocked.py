"""The chunked SSD over a long row in blocks of positions, each block recomputed in the backward
(`ModelConfig.ssd_block`): a `lax.scan` over blocks carrying the state, `ssd_chunked` on each.

Why: `ssd_chunked` on a whole 131K-token row builds its fp32 intra-chunk tensors
([chunks, heads, L, L] decays and scores, 2.1 GB each for 32 heads at L = 128) for every chunk
at once, and a Mamba layer's backward holds dozens of them (experiments/bench/RESULTS.md,
issue 15). Here one block's exist at a time; the price is one more forward of the SSD core
(a few percent of a Mamba layer's FLOPs).

Packed segments: the carried state enters a block only when the block's first position is in
the segment that ended the previous block (`ssd_chunked` gives its initial state to the first
segment of the block); a segment that starts exactly at a block boundary starts from zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon.model.ssd import ssd_chunked


def ssd_blocked(x, dt, A, B, C, D, chunk_size: int, block: int, segment_ids=None):
    """As `ssd_chunked` (no initial state): x [b, t, H, P], dt [b, t, H], B, C [b, t, G, N]
    -> (y [b, t, H, P], final state [b, H, P, N]), `block` positions at a time."""
    b, t, h, p = x.shape
    n_state = B.shape[-1]
    pad = (-t) % block
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids

    def blocks(z, mode="constant"):
        z = jnp.pad(z, [(0, 0), (0, pad)] + [(0, 0)] * (z.ndim - 2), mode=mode)
        return z.reshape(b, -1, block, *z.shape[2:]).swapaxes(0, 1)  # [n, b, block, ...]

    # Padding: dt = 0 leaves the state alone, its segment continues the last one.
    xs = (blocks(x), blocks(dt), blocks(B), blocks(C), blocks(seg, mode="edge"))

    def one(xb, dtb, Bb, Cb, sb, h0):
        return ssd_chunked(xb, dtb, A, Bb, Cb, D, chunk_size, h0=h0, segment_ids=sb)

    one = jax.checkpoint(one)

    def step(carry, blk):
        state, last = carry
        xb, dtb, Bb, Cb, sb = blk
        h0 = state * (sb[:, 0] == last).astype(state.dtype)[:, None, None, None]
        y, state = one(xb, dtb, Bb, Cb, sb, h0)
        return (state, sb[:, -1]), y

    init = (jnp.zeros((b, h, p, n_state), x.dtype), seg[:, 0])
    (state, _), ys = jax.lax.scan(step, init, xs)
    y = ys.swapaxes(0, 1).reshape(b, -1, h, p)[:, :t]
    return y, state
