"""Whole-model properties: decode == forward, continuation, causality, packing, sharding."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import sharding
from avalon.backends.decode import unstack_params
from avalon.model import forward, init_cache, init_params, param_shardings, presets
from avalon.model.config import MoeBackend
from avalon.model.params import abstract_params

CFG = presets.get("tiny")  # "MEME*-ME*M": all four letters, repeated runs, latent MoE


@pytest.fixture(scope="module")
def params():
    return init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 21), 0, CFG.vocab_size)


@pytest.fixture(scope="module")
def full(params, tokens):
    return jax.jit(lambda p, t: forward(p, t, CFG))(params, tokens)


_step = jax.jit(lambda p, t, c, n: forward(p, t, CFG, cache=c, num_new=n))


def test_prefill_then_decode_equals_full_forward(params, tokens, full):
    cache = init_cache(CFG, 2, 32)
    r = _step(params, tokens[:, :13], cache, None)
    logits, cache = [r.logits], r.cache
    for i in range(13, 21):
        r = _step(params, tokens[:, i:i + 1], cache, None)
        logits.append(r.logits)
        cache = r.cache
    np.testing.assert_allclose(jnp.concatenate(logits, 1), full.logits, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(cache.lengths, [21, 21])


def test_multi_token_continuation_equals_full_forward(params, tokens, full):
    """Chunks of 5, 1, 8 and 7 tokens, each fed as an 8-wide right-padded chunk (num_new)."""
    cache = init_cache(CFG, 2, 32)
    out, start = [], 0
    for n in (5, 1, 8, 7):
        chunk = jnp.pad(tokens[:, start:start + n], [(0, 0), (0, 8 - n)])
        r = _step(params, chunk, cache, jnp.array([n, n]))
        out.append(r.logits[:, :n])
        cache, start = r.cache, start + n
    np.testing.assert_allclose(jnp.concatenate(out, 1), full.logits, atol=2e-5, rtol=0)


def test_right_padded_rows_advance_independently(params, tokens, full):
    """Rows extend by different counts in one call (num_new); padding never leaks in."""
    cache = init_cache(CFG, 2, 32)
    r = _step(params, tokens[:, :8], cache, jnp.array([8, 3]))
    np.testing.assert_array_equal(r.cache.lengths, [8, 3])
    np.testing.assert_allclose(r.logits[0], full.logits[0, :8], atol=2e-5)
    np.testing.assert_allclose(r.logits[1, :3], full.logits[1, :3], atol=2e-5)
    # Row 1 continues from position 3 with the true tokens: equal to the full forward again.
    nxt = jnp.stack([tokens[0, 8:16], tokens[1, 3:11]])
    r2 = _step(params, nxt, r.cache, jnp.array([8, 8]))
    np.testing.assert_allclose(r2.logits[0], full.logits[0, 8:16], atol=2e-5)
    np.testing.assert_allclose(r2.logits[1], full.logits[1, 3:11], atol=2e-5)
    # A row with num_new = 0 keeps its whole state.
    r3 = _step(params, nxt[:, :1], r2.cache, jnp.array([1, 0]))
    np.testing.assert_array_equal(r3.cache.lengths, [17, 11])
    for a, b in zip(jax.tree.leaves(r3.cache.blocks), jax.tree.leaves(r2.cache.blocks)):
        np.testing.assert_array_equal(np.asarray(a)[:, 1], np.asarray(b)[:, 1])


def test_causality_by_gradients(params, tokens):
    """d logits[t] / d input embedding[s] is zero for s > t and nonzero for s <= t."""
    t = 9

    @jax.jit
    def grad_wrt_inputs(params):
        # Feed the row's own embeddings through an extended table so they can be differentiated.
        emb = jnp.take(params["embed"], tokens[0], axis=0)
        ids = jnp.arange(tokens.shape[1])[None]

        def out_at_t(e):
            table = jnp.concatenate([e, params["embed"]], axis=0)
            return jnp.sum(forward({**params, "embed": table}, ids, CFG).logits[0, t] ** 2)

        return jax.grad(out_at_t)(emb)

    per_pos = jnp.abs(grad_wrt_inputs(params)).sum(-1)
    assert float(per_pos[t + 1:].max()) == 0.0
    assert bool(jnp.all(per_pos[:t + 1] > 0))


def test_packed_segments_do_not_leak(params):
    """Three sequences packed into one row give the same logits as each run alone.

    Row 0 is the packed row; rows 1-3 hold each sequence alone, right-padded (by causality the
    padding after a sequence cannot affect it), all in one forward."""
    lens, width = [7, 1, 12], 20
    seqs = [jax.random.randint(jax.random.key(10 + i), (n,), 0, CFG.vocab_size)
            for i, n in enumerate(lens)]
    rows = [jnp.concatenate(seqs)] + [jnp.pad(s, (0, width - len(s))) for s in seqs]
    seg = [jnp.concatenate([jnp.full((n,), i + 1) for i, n in enumerate(lens)])]
    seg += [jnp.ones((width,), jnp.int32)] * 3
    out = jax.jit(lambda p, t, s: forward(p, t, CFG, segment_ids=s).logits)(
        params, jnp.stack(rows), jnp.stack(seg))
    start = 0
    for i, n in enumerate(lens):
        np.testing.assert_allclose(out[0, start:start + n], out[i + 1, :n], atol=2e-5, rtol=0)
        start += n


def test_unscanned_stack_equals_scanned(params, tokens, full):
    """scan_layers=False (one block per layer) computes the same function."""
    flat_cfg = CFG.replace(scan_layers=False)
    flat = unstack_params(CFG, params)
    assert jax.tree.structure(flat) == jax.tree.structure(abstract_params(flat_cfg))
    r = jax.jit(lambda p, t: forward(p, t, flat_cfg))(flat, tokens)
    np.testing.assert_allclose(r.logits, full.logits, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(r.routing, full.routing)


def test_routing_replay_reproduces_logits(params, tokens, full):
    r = jax.jit(lambda p, t, rt: forward(p, t, CFG, routing=rt))(params, tokens, full.routing)
    np.testing.assert_allclose(r.logits, full.logits, atol=1e-6, rtol=0)
    assert full.routing.shape == (CFG.count("E"), 2, 21, CFG.num_experts_per_tok)


@pytest.mark.parametrize("mesh_shape", [{"data": 2, "tensor": 4}, {"fsdp": 2, "expert": 4}])
def test_sharded_forward_equals_unsharded(params, tokens, full, mesh_shape):
    mesh = sharding.make_mesh(mesh_shape)
    shardings = param_shardings(CFG, mesh, sharding.TRAIN_RULES)
    sharded = jax.device_put(params, shardings)
    tok_sharding = jax.sharding.NamedSharding(
        mesh, sharding.logical_to_spec(("batch", "act_seq"), sharding.TRAIN_RULES, mesh,
                                       tokens.shape))

    def run(p, t):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return forward(p, t, CFG)

    r = jax.jit(run, in_shardings=(shardings, tok_sharding))(sharded, tokens)
    np.testing.assert_allclose(r.logits, full.logits, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(r.routing, full.routing)
    # The params really are split across devices.
    up = sharded["blocks"][0]["1_moe"]["experts_up"]
    assert len(up.sharding.device_set) == 8 and up.addressable_shards[0].data.size < up.size


def test_platform_default_dispatch_end_to_end(params, tokens, full):
    """The checks above run tiny pinned to RAGGED_DOT; here the MoE dispatch each platform runs
    by default (AUTO: on CPU the grouped tiles; under a mesh the expert-parallel path, each
    chip's experts in grouped tiles). Its full forward equals RAGGED_DOT's (same experts chosen),
    prefill then decode equals its own full forward, and the sharded forward the unsharded."""
    cfg = CFG.replace(moe_backend=MoeBackend.AUTO)
    auto = jax.jit(lambda p, t: forward(p, t, cfg))(params, tokens)
    np.testing.assert_array_equal(auto.routing, full.routing)
    np.testing.assert_allclose(auto.logits, full.logits, atol=2e-5, rtol=0)

    step = jax.jit(lambda p, t, c: forward(p, t, cfg, cache=c))
    r = step(params, tokens[:, :13], init_cache(cfg, 2, 32))
    logits, cache = [r.logits], r.cache
    for i in range(13, 21):
        r = step(params, tokens[:, i:i + 1], cache)
        logits.append(r.logits)
        cache = r.cache
    np.testing.assert_allclose(jnp.concatenate(logits, 1), auto.logits, atol=2e-5, rtol=0)

    mesh = sharding.make_mesh({"fsdp": 2, "expert": 4})
    shardings = param_shardings(cfg, mesh, sharding.TRAIN_RULES)

    def run(p, t):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return forward(p, t, cfg)

    r = jax.jit(run, in_shardings=(shardings, None))(jax.device_put(params, shardings), tokens)
    np.testing.assert_allclose(r.logits, auto.logits, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(r.routing, auto.routing)


def test_profile_names_each_layer_kind(params, tokens):
    """`jax.named_scope` per layer kind: the lowered forward names each op after its layer kind
    and the LM head, as a profile (TensorBoard, Perfetto) shows them."""
    text = jax.jit(lambda p, t: forward(p, t, CFG)).lower(params, tokens).as_text(
        debug_info=True)
    assert {"mamba", "moe", "attention", "mlp", "head"} <= set(
        re.findall(r"jit\(<lambda>\)/([a-z_]+)/", text))


def test_bad_calls_name_the_problem(params, tokens):
    with pytest.raises(ValueError, match="segment_ids"):
        forward(params, tokens, CFG, segment_ids=jnp.ones_like(tokens),
                cache=init_cache(CFG, 2, 8))
    with pytest.raises(ValueError, match="num_new"):
        forward(params, tokens, CFG, num_new=jnp.array([1, 1]))


def test_decode_dt_clamp_makes_decode_equal_the_full_forward():
    """With dt_bias low enough that softplus < time_step_min, HF's unclamped decode step differs
    from the (clamped) full forward; `decode_dt_clamp` removes the difference."""
    cfg = CFG.replace(pattern="M", decode_dt_clamp=True)
    params = init_params(jax.random.key(7), cfg)
    blk = params["blocks"][0]["0_mamba"]
    # dt = softplus(-12) ~ 6e-6, well under the 1e-3 clamp. With D = 0 the Mamba output is the
    # state's read-out alone, which scales with dt; the gated norm then makes it visible.
    params["blocks"][0]["0_mamba"] = {**blk, "dt_bias": jnp.full_like(blk["dt_bias"], -12.0),
                                      "D": jnp.zeros_like(blk["D"]), "out": blk["out"] * 10.0}
    toks = jax.random.randint(jax.random.key(8), (1, 6), 0, cfg.vocab_size)
    full = forward(params, toks, cfg).logits

    def decode_last(c):
        cache = forward(params, toks[:, :5], c, cache=init_cache(c, 1, 8)).cache
        return forward(params, toks[:, 5:], c, cache=cache).logits[:, 0]

    scale = float(jnp.abs(full[:, 5]).max())
    clamped = float(jnp.abs(decode_last(cfg) - full[:, 5]).max()) / scale
    hf_like = float(jnp.abs(decode_last(cfg.replace(decode_dt_clamp=False)) - full[:, 5]).max())
    assert clamped < 1e-6, clamped
    assert hf_like / scale > 1e-4, hf_like / scale
