"""The naive attention reference (every score materialised) and the packed inputs the FLASH and
CAUSAL_SCAN equivalence tests both check against."""

import jax
import jax.numpy as jnp

from avalon.model.attention import _scores_to_out

B, T, H, G, D = 2, 37, 2, 3, 8  # T not a multiple of the block: a ragged last block
SCALE = D ** -0.5


def _naive(q, k, v, seg):
    pos = jnp.arange(q.shape[1])
    mask = (pos[:, None] >= pos[None, :])[None] & (seg[:, :, None] == seg[:, None, :])
    return _scores_to_out(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask[:, None, None], SCALE)


def packed_inputs():
    kq, kk, kv, kg = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(kq, (B, T, H, G, D)) * 2.0  # peaked softmax rows
    k = jax.random.normal(kk, (B, T, H, D))
    v = jax.random.normal(kv, (B, T, H, D))
    probe = jax.random.normal(kg, (B, T, H, G, D))
    # Row 0: one sequence; row 1: three packed segments (one starts mid-block, so earlier
    # key blocks are fully masked for it) and trailing padding (segment 0).
    seg = jnp.stack([jnp.ones(T, jnp.int32),
                     jnp.concatenate([jnp.full(10, 1), jnp.full(15, 2), jnp.full(7, 3),
                                      jnp.zeros(5)]).astype(jnp.int32)])
    return q, k, v, seg, probe
