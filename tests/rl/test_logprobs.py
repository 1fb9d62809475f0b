"""Chunked token log-probs; packed rows == the same sequences unpacked; routing replay gives
on-policy importance ratios of 1 (against a sampler that records its routing)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.rl.build import build_rl_batch
from avalon.rl.config import RLConfig
from avalon.rl.logprobs import sequence_logprobs, token_logprobs
from avalon.rl.types import TokenFlag, TrajectoryRow
from avalon.rl.update import make_update_step
from tests.rl.helpers import make_group, make_rollout

CFG = M.presets.get("tiny")  # Mamba-2, MoE (latent, group routing), attention, MLP
M_MOE, K = CFG.count("E"), CFG.num_experts_per_tok
LENGTHS = (24, 17, 20, 11)  # one sampled buffer of 24, rows cut to these lengths
PROMPT = 6
SEQ = 32


@pytest.fixture(scope="module")
def params():
    p = M.init_params(jax.random.key(0), CFG)
    # Experts and router large enough that which experts run visibly changes the log-probs.
    scale = {"experts_up": 10.0, "experts_down": 10.0, "router": 20.0}
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale.get(path[-1].key, 1.0), p)


# ---- chunked log-probs against full logits ----------------------------------------------------
def test_chunked_logprobs_match_full_log_softmax(params):
    params = {k: params[k] for k in ("final_norm", "lm_head")}  # all the LM head reads
    b, s = 2, 37  # 37 = 4 chunks of 8 + a padded one
    hidden = jax.random.normal(jax.random.key(1), (b, s, CFG.hidden_size))
    targets = jax.random.randint(jax.random.key(2), (b, s), 0, CFG.vocab_size)
    temperature = 0.7
    fn = jax.jit(token_logprobs, static_argnames=("cfg", "chunk", "temperature", "keep_logits"))
    logp, ent = fn(params, hidden, targets, cfg=CFG, chunk=8, temperature=temperature)
    full = np.asarray(M.lm_logits(params, hidden, CFG), np.float64) / temperature
    lsm = full - np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - full.max(-1, keepdims=True)
    np.testing.assert_allclose(logp, np.take_along_axis(lsm, np.asarray(targets)[..., None],
                                                        -1)[..., 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, -(np.exp(lsm) * lsm).sum(-1), rtol=1e-5, atol=1e-5)

    # Gradients through the checkpointed chunks equal the one-chunk (unchunked) gradients, and
    # so do those with the logits kept (one product whatever the chunk).
    w = jax.random.normal(jax.random.key(3), (b, s))
    def f(p, h, chunk, keep=False):
        return jnp.sum(w * token_logprobs(p, h, targets, CFG, chunk=chunk,
                                          temperature=temperature, keep_logits=keep)[0])
    grad = jax.jit(jax.grad(f, argnums=(0, 1)), static_argnums=(2, 3))
    g_chunked, g_full = grad(params, hidden, 8), grad(params, hidden, s)
    for a, c in zip(jax.tree.leaves(g_chunked), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    for a, c in zip(jax.tree.leaves(grad(params, hidden, 8, True)), jax.tree.leaves(g_full)):
        np.testing.assert_array_equal(a, c)
    kept = fn(params, hidden, targets, cfg=CFG, chunk=8, temperature=temperature,
              keep_logits=True)
    whole = fn(params, hidden, targets, cfg=CFG, chunk=s, temperature=temperature)
    for a, c in zip(kept, whole):
        np.testing.assert_array_equal(a, c)
    # Kept: one LM-head product, no map over chunks to recompute in the backward.
    def prims(keep):
        jaxpr = jax.make_jaxpr(lambda h: token_logprobs(params, h, targets, CFG, chunk=8,
                                                        keep_logits=keep))(hidden)
        return {e.primitive.name for e in jaxpr.jaxpr.eqns}
    assert "scan" in prims(False) and "scan" not in prims(True)


# ---- a sampler that records log-probs and routing ----------------------------------------------
@functools.partial(jax.jit, static_argnums=2)
def _forward(params, tokens, cfg):
    r = M.forward(params, tokens, cfg)
    return jax.nn.log_softmax(r.logits, -1), r.routing


@pytest.fixture(scope="module")
def sampled(params):
    """Sample 4 continuations of random prompts token by token (full forward over a fixed
    buffer; causal, so later buffer contents do not matter). Records, per token, the sampler's
    log-prob and the routing used when that token was the input, as the engine does."""
    g, n = len(LENGTHS), max(LENGTHS)
    rng = np.random.default_rng(0)
    tokens = np.zeros((g, n), np.int32)
    tokens[:, :PROMPT] = rng.integers(0, CFG.vocab_size, (g, PROMPT))
    logp = np.zeros((g, n), np.float32)
    routing = np.zeros((g, n, M_MOE, K), np.int32)
    key = jax.random.key(1)
    for t in range(PROMPT, n + 1):
        lsm, route = _forward(params, jnp.asarray(tokens), CFG)
        lo = 0 if t == PROMPT else t - 1
        routing[:, lo:t] = np.asarray(route[:, :, lo:t]).transpose(1, 2, 0, 3)
        if t == n:
            break
        key, sub = jax.random.split(key)
        tok = np.asarray(jax.random.categorical(sub, lsm[:, t - 1]))
        tokens[:, t] = tok
        logp[:, t] = np.asarray(lsm[:, t - 1])[np.arange(g), tok]
    final_lsm, final_route = _forward(params, jnp.asarray(tokens), CFG)
    return tokens, logp, routing, np.asarray(final_lsm), np.asarray(final_route)


def _rows(sampled):
    tokens, logp, routing = sampled[:3]
    rows = []
    for i, n in enumerate(LENGTHS):
        mask = np.arange(n) >= PROMPT
        flags = np.zeros(n, np.int8)
        flags[PROMPT + 2:PROMPT + 5] = TokenFlag.MALFORMED
        rows.append(TrajectoryRow(tokens[i, :n], mask, logp[i, :n], routing[i, :n], flags,
                                  agent=f"a{i}", role="R"))
    return rows


def _group(sampled):
    rows = _rows(sampled)
    return make_group(0, [make_rollout(rows[:2], [1.0]), make_rollout(rows[2:], [0.0])])


def _unpack(batch, values):
    """Per row (in LENGTHS order, identified by their tokens): values at its target positions."""
    out = {}
    for b in range(batch.tokens.shape[0]):
        for seg in range(1, batch.segment_ids[b].max() + 1):
            pos = np.flatnonzero(batch.segment_ids[b] == seg)
            out[len(pos)] = np.asarray(values)[b, pos[:-1]]
    return [out[n] for n in LENGTHS]


def test_packed_rows_match_the_same_sequences_unpacked(sampled, params):
    tokens, _, _, final_lsm, final_route = sampled
    rl_cfg = RLConfig()
    batch, stats = build_rl_batch([_group(sampled)], rl_cfg, seq_len=SEQ, min_seqs=4)
    assert stats.packing.sequences == 4 and batch.segment_ids.max() >= 2  # rows share sequences
    fn = jax.jit(functools.partial(sequence_logprobs, cfg=CFG, chunk=8))
    logp, _, route, _ = fn(params, batch.tokens, batch.targets, segment_ids=batch.segment_ids)
    for i, (n, got) in enumerate(zip(LENGTHS, _unpack(batch, logp))):
        want = final_lsm[i, np.arange(n - 1), tokens[i, 1:n]]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # The live routing of the packed forward is the unpacked one too (no replay here).
    route = np.asarray(route).transpose(1, 2, 0, 3)  # [B, S, m, k]
    for b in range(batch.tokens.shape[0]):
        for seg in range(1, batch.segment_ids[b].max() + 1):
            pos = np.flatnonzero(batch.segment_ids[b] == seg)
            i = LENGTHS.index(len(pos))
            np.testing.assert_array_equal(route[b, pos], final_route[:, i, :len(pos)]
                                          .transpose(1, 0, 2))


def test_routing_replay_gives_on_policy_ratios_of_one(sampled, params):
    rl_cfg = RLConfig(logprob_chunk=8)
    batch, _ = build_rl_batch([_group(sampled)], rl_cfg, seq_len=SEQ, min_seqs=4,
                              routing_shape=(M_MOE, K))
    step = make_update_step(CFG, rl_cfg)
    logp, _ = step.logprobs(params, batch)
    mask = batch.loss_mask
    ratio = np.exp(np.asarray(logp)[mask] - batch.old_logp[mask])
    assert mask.sum() == sum(n - PROMPT for n in LENGTHS)
    np.testing.assert_allclose(ratio, 1.0, rtol=0, atol=2e-5)
    # The replayed routing is what the forward used: other experts give other log-probs.
    other = batch.replace(routing=(batch.routing + 1) % CFG.n_routed_experts)
    logp_other, _ = step.logprobs(params, other)
    assert np.abs(np.asarray(logp_other)[mask] - np.asarray(logp)[mask]).max() > 1e-3


def test_one_hot_pick_under_a_vocab_split_mesh_equals_the_gather():
    """On one device the target's logit is a gather; under a mesh (the vocabulary split over
    `tensor`) a one-hot select. Both give the same log-probs and the same gradients."""
    from avalon import sharding

    full = M.init_params(jax.random.key(4), CFG)
    params = {k: full[k] for k in ("final_norm", "lm_head")}
    b, s = 4, 16
    hidden = jax.random.normal(jax.random.key(5), (b, s, CFG.hidden_size))
    targets = jax.random.randint(jax.random.key(6), (b, s), 0, CFG.vocab_size)
    w = jax.random.normal(jax.random.key(7), (b, s))

    def f(p, h):
        logp, _ = token_logprobs(p, h, targets, CFG, chunk=8)
        return jnp.sum(w * logp), logp

    grad = jax.grad(f, argnums=(0, 1), has_aux=True)
    (gp_one, gh_one), logp_one = jax.jit(grad)(params, hidden)
    mesh = sharding.make_mesh({"data": 2, "tensor": 4})

    def under_mesh(p, h):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return grad(p, h)

    (gp_mesh, gh_mesh), logp_mesh = jax.jit(under_mesh)(params, hidden)
    np.testing.assert_allclose(logp_mesh, logp_one, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gh_mesh, gh_one, rtol=1e-5, atol=1e-6)
    for a, c in zip(jax.tree.leaves(gp_mesh), jax.tree.leaves(gp_one)):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
