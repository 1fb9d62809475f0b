"""Implementation switches compute the same function: remat, query-chunked attention, bf16.

Each test uses the smallest pattern that exercises its switch: gradient programs of the whole
tiny stack take tens of seconds to compile on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import AttentionImpl, Remat, forward, init_params, mtp_logits, presets

CFG = presets.get("tiny")
SCANNED = CFG.replace(pattern="MEME")  # one scanned run of ("ME", 2)
ATTN = CFG.replace(pattern="*-")


@pytest.fixture(scope="module")
def params():
    return init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 21), 0, CFG.vocab_size)


def _loss_and_grad(cfg, params, tokens, segment_ids=None):
    def loss(p):
        logits = forward(p, tokens, cfg, segment_ids=segment_ids).logits
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])
    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("remat", [Remat.FULL, Remat.DOTS, Remat.SELECTIVE,
                                   Remat.SELECTIVE_UNITS])
def test_remat_gives_the_same_gradients(tokens, remat):
    params = init_params(jax.random.key(5), SCANNED)
    base_loss, base_grad = _loss_and_grad(SCANNED, params, tokens)
    loss, grad = _loss_and_grad(SCANNED.replace(remat=remat), params, tokens)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("remat,inputs", [(Remat.SELECTIVE, 2), (Remat.SELECTIVE_UNITS, 1)])
def test_selective_remat_keeps_layer_or_unit_inputs(tokens, remat, inputs):
    """The scanned "ME" unit's backward keeps each layer's input [reps, b, t, D] under
    SELECTIVE, only the unit's under SELECTIVE_UNITS (one checkpoint over the unit; the
    gradients are checked against no remat above)."""
    cfg = SCANNED.replace(remat=remat)
    params = init_params(jax.random.key(5), cfg)
    _, vjp = jax.vjp(lambda p: forward(p, tokens, cfg, return_logits=False).hidden, params)
    param_ids = {id(a) for a in jax.tree.leaves(params)}
    saved = [a.shape for a in jax.tree.leaves(vjp) if id(a) not in param_ids]
    assert saved.count((2, *tokens.shape, cfg.hidden_size)) == inputs, saved


@pytest.mark.parametrize("impl", [AttentionImpl.QUERY_CHUNKED, AttentionImpl.BLOCK_CAUSAL])
def test_chunked_attention_equals_naive(tokens, impl):
    params = init_params(jax.random.key(6), ATTN)
    seg = jnp.concatenate([jnp.ones((2, 12), jnp.int32), jnp.full((2, 9), 2)], axis=1)
    chunked = ATTN.replace(attention_impl=impl, attention_query_chunk=8)
    base_loss, base_grad = _loss_and_grad(ATTN, params, tokens, seg)
    loss, grad = _loss_and_grad(chunked, params, tokens, seg)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):
        assert bool(jnp.all(jnp.isfinite(a)))
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_bfloat16_tracks_float32(params, tokens):
    """bf16 weights and activations (fp32 norms, router, SSM, softmax) stay close to fp32."""
    bf_cfg = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    bf_params = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a,
                             params)
    # The router and its bias stay fp32, as HF keeps them.
    for blk in params["blocks"]:
        for key, lp in blk.items():
            if key.endswith("moe"):
                assert lp["router"].dtype == jnp.float32
    ref = jax.jit(lambda p, t: forward(p, t, CFG).logits)(params, tokens)
    out = jax.jit(lambda p, t: forward(p, t, bf_cfg).logits)(bf_params, tokens)
    assert out.dtype == jnp.float32
    rel = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
    assert rel < 0.05, rel


def _np_rms(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def test_mtp_head_equals_a_hand_computation():
    """An MTP block with one MLP layer against NumPy (float64) from its definition: h =
    eh_proj [enorm(E[next]); hnorm(hidden)], h + down(relu(up(norm(h)))^2), the MTP final
    norm, the shared LM head. The norm weights are random so that each norm, and the order of
    the concatenation, shows in the result."""
    cfg = CFG.replace(pattern="-", mtp_pattern="-")
    params = init_params(jax.random.key(5), cfg)
    keys = iter(jax.random.split(jax.random.key(6), 8))
    mtp = dict(params["mtp"])
    for name in ("enorm", "hnorm", "final_norm"):
        mtp[name] = 1 + jax.random.normal(next(keys), mtp[name].shape)
    layer = dict(mtp["layers"][0])
    layer["norm"] = 1 + jax.random.normal(next(keys), layer["norm"].shape)
    for name in ("up", "down"):  # large enough that the MLP's contribution is visible
        layer[name] = layer[name] * 10
    mtp["layers"] = [layer]
    params = {**params, "mtp": mtp}
    hidden = jax.random.normal(next(keys), (2, 5, cfg.hidden_size))
    nxt = jax.random.randint(next(keys), (2, 5), 0, cfg.vocab_size)
    got = np.asarray(jax.jit(lambda p, h, n: mtp_logits(p, h, n, cfg))(params, hidden, nxt))

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    m, lp, eps = p["mtp"], p["mtp"]["layers"][0], cfg.layer_norm_epsilon
    x = np.concatenate([_np_rms(p["embed"][np.asarray(nxt)], m["enorm"], eps),
                        _np_rms(np.asarray(hidden, np.float64), m["hnorm"], eps)], axis=-1)
    h = x @ m["eh_proj"]
    h = h + np.maximum(_np_rms(h, lp["norm"], eps) @ lp["up"], 0) ** 2 @ lp["down"]
    want = _np_rms(h, m["final_norm"], eps) @ p["lm_head"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # Swapping the two halves of the concatenation changes the answer (the order is tested).
    swapped = np.concatenate([x[..., cfg.hidden_size:], x[..., :cfg.hidden_size]], -1)
    assert not np.allclose(swapped @ m["eh_proj"], x @ m["eh_proj"], atol=1e-3)


def test_mtp_head_predicts_from_hidden_and_next_token():
    cfg = CFG.replace(pattern="M", mtp_pattern="*E")
    params = init_params(jax.random.key(3), cfg)
    toks = jax.random.randint(jax.random.key(4), (2, 9), 0, cfg.vocab_size)

    @jax.jit
    def run(p):
        hidden = forward(p, toks, cfg).hidden
        return mtp_logits(p, hidden[:, :-1], toks[:, 1:], cfg)

    logits = run(params)
    assert logits.shape == (2, 8, cfg.vocab_size)
    assert bool(jnp.all(jnp.isfinite(logits)))
    # The MTP block's own weights matter (it is not a pass-through of the main head).
    changed = dict(params, mtp={**params["mtp"],
                                "eh_proj": params["mtp"]["eh_proj"] * 2.0})
    assert not np.allclose(run(changed), logits)
    with pytest.raises(ValueError, match="mtp_pattern"):
        mtp_logits(params, jnp.zeros((1, 1, cfg.hidden_size)), toks[:1, :1], CFG)
