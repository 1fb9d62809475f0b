"""The FLASH full-sequence attention (query blocks, block-causal, custom VJP) equals the naive
reference that materialises every score: outputs and gradients, packed segments included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import AttentionImpl, forward, init_params, presets
from avalon.model.attention import _flash_attention
from tests.model.attention_reference import SCALE, T, _naive, packed_inputs


@pytest.fixture(scope="module")
def inputs():
    return packed_inputs()


@pytest.mark.parametrize("block", [8, 16, T])
def test_flash_equals_naive_values_and_gradients(inputs, block):
    q, k, v, seg, probe = inputs

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * probe)

    flash = lambda q, k, v: _flash_attention(q, k, v, seg, SCALE, block)  # noqa: E731
    naive = lambda q, k, v: _naive(q, k, v, seg)  # noqa: E731
    np.testing.assert_allclose(jax.jit(flash)(q, k, v), naive(q, k, v), atol=2e-6, rtol=1e-5)
    g_flash = jax.jit(jax.grad(lambda *a: loss(flash, *a), argnums=(0, 1, 2)))(q, k, v)
    g_naive = jax.grad(lambda *a: loss(naive, *a), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_flash, g_naive):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_model_with_flash_attention_equals_naive():
    """Through the whole model (packed rows, gradients of every param) at a length of several
    FLASH blocks (attention and MLP layers: the Mamba and MoE compiles add nothing here)."""
    cfg = presets.get("tiny", pattern="*-*", max_context=512)
    params = init_params(jax.random.key(1), cfg)
    t = 300
    tokens = jax.random.randint(jax.random.key(2), (1, t), 0, cfg.vocab_size)
    seg = jnp.concatenate([jnp.full(130, 1), jnp.full(170, 2)])[None].astype(jnp.int32)

    def loss(p, impl):
        r = forward(p, tokens, cfg.replace(attention_impl=impl), segment_ids=seg)
        return jnp.mean(r.logits ** 2)

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    v_flash, g_flash = grad(params, AttentionImpl.FLASH)
    v_naive, g_naive = grad(params, AttentionImpl.NAIVE)
    np.testing.assert_allclose(v_flash, v_naive, rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_flash),
                            jax.tree.leaves(g_naive)):
        scale = float(jnp.abs(b).max())
        np.testing.assert_allclose(a, b, atol=1e-5 * scale + 1e-9, rtol=1e-4,
                                   err_msg=jax.tree_util.keystr(path))
