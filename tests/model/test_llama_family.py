"""The Llama/Qwen layer options through the model's own paths (the HF parity tests hold the
math against transformers; these hold the implementation switches against each other).

`tiny_llama` turns on every attention option at once (q/k/v biases, q/k norm, a partial
rotation of 8 of 16 dims, SwiGLU, tied embeddings); `tiny_qwen3_moe` adds the softmax router
and SwiGLU experts. Checked: rotary embedding against a NumPy rotation written from the
formula; every attention kernel (query-chunked, block-causal, FLASH, causal scan) equals
NAIVE on packed rows, forward and gradients; causality by gradients; a packed sequence equals
itself alone (positions restart); sharded equals unsharded under tensor and expert meshes;
remat keeps the gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import sharding
from avalon.model import AttentionImpl, Remat, forward, init_params, param_shardings, presets
from avalon.model.config import RopeScaling
from avalon.model.rope import apply_rope, inv_freq

LLAMA = presets.get("tiny_llama")
MOE = presets.get("tiny_qwen3_moe")


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 21), 0, LLAMA.vocab_size)


@pytest.fixture(scope="module")
def seg():
    return jnp.concatenate([jnp.ones((2, 12), jnp.int32), jnp.full((2, 9), 2)], axis=1)


def _perturbed(cfg, key=0):
    """Random params with norms and biases moved off their init (ones / zeros)."""
    params = init_params(jax.random.key(key), cfg)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(key + 100), len(leaves))
    return jax.tree.unflatten(tree, [a + 0.1 * jax.random.normal(k, a.shape, a.dtype)
                                     for a, k in zip(leaves, keys)])


def test_rope_matches_numpy_rotation():
    cfg = LLAMA.replace(rope_scaling=RopeScaling.LLAMA3, rope_factor=8.0,
                        rope_original_max_position=16)
    x = np.asarray(jax.random.normal(jax.random.key(3), (1, 5, 2, 16)), np.float64)
    pos = np.array([[0, 1, 7, 30, 100]])
    r = 8
    f = 1.0 / (10000.0 ** (np.arange(0, r, 2) / r))
    wavelen = 2 * np.pi / f
    low, high = 16 / 1.0, 16 / 4.0  # old context / low and high frequency factors
    smooth = (16 / wavelen - 1.0) / (4.0 - 1.0)
    f = np.where(wavelen > low, f / 8, np.where(wavelen < high, f,
                                                (1 - smooth) * f / 8 + smooth * f))
    np.testing.assert_allclose(inv_freq(cfg), f, rtol=1e-6)
    want = x.copy()
    for b in range(5):
        for i in range(r // 2):  # dims i and i + r/2 rotate together (rotate-half layout)
            a = pos[0, b] * f[i]
            u, v = x[0, b, :, i], x[0, b, :, i + r // 2]
            want[0, b, :, i] = u * np.cos(a) - v * np.sin(a)
            want[0, b, :, i + r // 2] = v * np.cos(a) + u * np.sin(a)
    got = apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(pos), cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got)[..., r:], x[..., r:].astype(np.float32))
    # With the positions bounded (a forward without a cache), cos and sin are gathered from a
    # table over 0..bound-1: the same rotation.
    tabled = apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(pos), cfg, bound=101)
    np.testing.assert_allclose(tabled, got, rtol=1e-6, atol=1e-6)


def _loss_and_grad(cfg, params, tokens, segment_ids=None):
    def loss(p):
        logits = forward(p, tokens, cfg, segment_ids=segment_ids).logits
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])
    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("impl", [AttentionImpl.QUERY_CHUNKED, AttentionImpl.BLOCK_CAUSAL,
                                  AttentionImpl.FLASH, AttentionImpl.CAUSAL_SCAN])
def test_attention_kernels_equal_naive(tokens, seg, impl):
    cfg = LLAMA.replace(pattern="*-")
    params = _perturbed(cfg)
    base_loss, base_grad = _loss_and_grad(cfg, params, tokens, seg)
    loss, grad = _loss_and_grad(cfg.replace(attention_impl=impl, attention_query_chunk=8),
                                params, tokens, seg)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_packed_sequence_equals_itself_alone(tokens, seg):
    params = _perturbed(LLAMA)
    run = jax.jit(lambda p, t, s: forward(p, t, LLAMA, segment_ids=s).logits)
    packed = run(params, tokens, seg)
    alone = run(params, tokens[:, 12:], None)  # the second segment as its own rows
    np.testing.assert_allclose(packed[:, 12:], alone, atol=1e-5, rtol=0)


def test_causality_by_gradients(tokens):
    """The logits at position 10 do not depend on the inputs after it (rotary embedding and
    all): the gradient of a probe of them with respect to noise on each input embedding."""
    params = _perturbed(LLAMA)
    probe = jax.random.normal(jax.random.key(9), (LLAMA.vocab_size,))

    def at10(noise):
        emb = jnp.take(params["embed"], tokens, axis=0) + noise
        return (_forward_from_embeddings(params, emb)[:, 10] @ probe).sum()

    grad = jax.grad(at10)(jnp.zeros((*tokens.shape, LLAMA.hidden_size)))
    assert float(jnp.abs(grad[:, :11]).max()) > 0
    assert float(jnp.abs(grad[:, 11:]).max()) == 0


def _forward_from_embeddings(params, emb):
    """The model on given input embeddings: each position gets its own vocabulary row."""
    b, t, d = emb.shape
    table = emb.reshape(b * t, d)
    ids = jnp.arange(b * t, dtype=jnp.int32).reshape(b, t)
    cfg = LLAMA.replace(vocab_size=b * t, tie_word_embeddings=False)
    p = {**params, "embed": table, "lm_head": params["embed"].T}
    return forward(p, ids, cfg).logits


@pytest.mark.parametrize("mesh_shape,cfg_name", [({"data": 2, "tensor": 4}, "llama"),
                                                 ({"fsdp": 2, "expert": 4}, "moe")])
def test_sharded_forward_equals_unsharded(mesh_shape, cfg_name):
    cfg = LLAMA if cfg_name == "llama" else MOE
    params = _perturbed(cfg)
    toks = jax.random.randint(jax.random.key(2), (8, 12), 0, cfg.vocab_size)
    full = jax.jit(lambda p, t: forward(p, t, cfg))(params, toks)
    mesh = sharding.make_mesh(mesh_shape)
    shardings = param_shardings(cfg, mesh, sharding.TRAIN_RULES)
    tok_sharding = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(
        ("batch", "act_seq"), sharding.TRAIN_RULES, mesh, toks.shape))

    def run(p, t):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return forward(p, t, cfg)

    r = jax.jit(run, in_shardings=(shardings, tok_sharding))(
        jax.device_put(params, shardings), toks)
    np.testing.assert_allclose(r.logits, full.logits, atol=1e-5, rtol=0)
    if cfg_name == "moe":
        np.testing.assert_array_equal(r.routing, full.routing)


def test_remat_keeps_the_gradients(tokens, seg):
    cfg = MOE.replace(pattern="*E")
    params = _perturbed(cfg)
    base_loss, base_grad = _loss_and_grad(cfg, params, tokens, seg)
    loss, grad = _loss_and_grad(cfg.replace(remat=Remat.SELECTIVE), params, tokens, seg)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)
