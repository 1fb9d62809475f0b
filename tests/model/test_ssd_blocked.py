"""The SSD in blocks of positions (ModelConfig.ssd_block) equals the whole-row chunked SSD:
outputs, final state and gradients, with packed segments that cross a block boundary, one that
starts exactly at a boundary, and a row that is not a whole number of blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import presets
from avalon.model.ssd import ssd_chunked
from avalon.model.ssd_blocked import ssd_blocked

B, T, H, P, G, N, L = 2, 88, 4, 8, 2, 8, 8


@pytest.fixture(scope="module")
def inputs():
    ks = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(ks[0], (B, T, H, P))
    dt = jax.nn.softplus(jax.random.normal(ks[1], (B, T, H)))
    A = -jnp.exp(jax.random.normal(ks[2], (H,)))
    Bm = jax.random.normal(ks[3], (B, T, G, N))
    Cm = jax.random.normal(ks[4], (B, T, G, N))
    D = jax.random.normal(ks[5], (H,))
    # Row 0: one segment; row 1: segments ending at 13, at 32 (a block boundary for block 16
    # and 32), at 70, then padding.
    seg = jnp.stack([jnp.ones(T, jnp.int32), jnp.concatenate(
        [jnp.full(13, 1), jnp.full(19, 2), jnp.full(38, 3), jnp.full(12, 4),
         jnp.zeros(6)]).astype(jnp.int32)])
    return x, dt, A, Bm, Cm, D, seg


@pytest.mark.parametrize("block", [16, 32])
def test_blocked_ssd_equals_whole_row(inputs, block):
    x, dt, A, Bm, Cm, D, seg = inputs
    probe = jax.random.normal(jax.random.key(9), x.shape)
    ref = lambda x, dt, Bm, Cm: ssd_chunked(x, dt, A, Bm, Cm, D, L, segment_ids=seg)  # noqa
    blk = lambda x, dt, Bm, Cm: ssd_blocked(x, dt, A, Bm, Cm, D, L, block,  # noqa: E731
                                            segment_ids=seg)
    y_ref, s_ref = ref(x, dt, Bm, Cm)
    y, s = jax.jit(blk)(x, dt, Bm, Cm)
    np.testing.assert_allclose(y, y_ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=1e-5)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a)[0] * probe) + jnp.sum(fn(*a)[1])  # noqa: E731
    g = jax.jit(jax.grad(loss(blk), argnums=(0, 1, 2, 3)))(x, dt, Bm, Cm)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2, 3))(x, dt, Bm, Cm)
    for name, a, b in zip(("x", "dt", "B", "C"), g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=name)


def test_ssd_block_must_be_a_multiple_of_the_chunk():
    with pytest.raises(ValueError, match=r"ssd_block.*multiple of chunk_size=8"):
        presets.get("tiny", ssd_block=12)
