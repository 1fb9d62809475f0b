"""The training Mamba mixer in blocks of positions (ModelConfig.ssd_block: conv, SSD and gated
norm a block at a time, `mamba2.mixer_core_blocked`) equals the whole-row mixer: outputs and
gradients (params and input), with packed segments that cross a block boundary, one that starts
exactly at a boundary, padding, no segments at all, and a row that is not a whole number of
blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import init_params, presets
from avalon.model.mamba2 import mamba_mixer

CFG = presets.get("tiny", pattern="M")  # chunk_size 8, conv window 4
B, T = 2, 88


@pytest.fixture(scope="module")
def inputs():
    params = init_params(jax.random.key(0), CFG)
    lp = jax.tree.map(lambda a: a[0], params["blocks"][0]["0_mamba"])
    x = jax.random.normal(jax.random.key(1), (B, T, CFG.hidden_size))
    # Row 0: one segment; row 1: segments ending at 13, at 32 (a block boundary for blocks of
    # 16 and 32), at 70, then padding.
    seg = jnp.stack([jnp.ones(T, jnp.int32), jnp.concatenate(
        [jnp.full(13, 1), jnp.full(19, 2), jnp.full(38, 3), jnp.full(12, 4),
         jnp.zeros(6)]).astype(jnp.int32)])
    return lp, x, seg


@pytest.mark.parametrize("block,segments", [(16, True), (32, False)])
def test_blocked_mixer_equals_whole_row(inputs, block, segments):
    lp, x, seg = inputs
    seg = seg if segments else None
    probe = jax.random.normal(jax.random.key(9), x.shape)

    def loss(cfg):
        return lambda lp, x: jnp.sum(mamba_mixer(lp, x, cfg, segment_ids=seg)[0] * probe)

    blocked = CFG.replace(ssd_block=block)
    y_ref = jax.jit(lambda lp, x: mamba_mixer(lp, x, CFG, segment_ids=seg)[0])(lp, x)
    y = jax.jit(lambda lp, x: mamba_mixer(lp, x, blocked, segment_ids=seg)[0])(lp, x)
    np.testing.assert_allclose(y, y_ref, atol=1e-5, rtol=1e-5)
    g_ref = jax.jit(jax.grad(loss(CFG), argnums=(0, 1)))(lp, x)
    g = jax.jit(jax.grad(loss(blocked), argnums=(0, 1)))(lp, x)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_ref), jax.tree.leaves(g)):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_ssd_block_must_be_a_multiple_of_the_chunk():
    with pytest.raises(ValueError, match=r"ssd_block.*multiple of chunk_size=8"):
        presets.get("tiny", ssd_block=12)
