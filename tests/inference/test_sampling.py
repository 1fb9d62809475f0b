"""The sampler against numpy references: truncation sets, the sampled distribution, the
log-probability convention, greedy, and per-(seed, position) determinism.

Two jitted shapes only ([64, 32] and [4096, 8]): compilation dominates these tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.inference.sampling import SamplingKnobs, inverse_cdf, sample, truncate


def _knobs(r, *, temperature=1.0, top_p=1.0, top_k=0, greedy=False, seed=None):
    full = lambda v, dt: np.full(r, v, dt)
    return SamplingKnobs(temperature=full(temperature, np.float32), top_p=full(top_p, np.float32),
                         top_k=full(top_k, np.int32), greedy=full(greedy, bool),
                         seed=np.arange(r, dtype=np.uint32) if seed is None
                         else full(seed, np.uint32))


_sample = jax.jit(sample)
_truncate = jax.jit(truncate)
R, V = 64, 32


def _softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_truncation_keeps_exactly_top_k_and_the_nucleus():
    logits = np.random.default_rng(0).normal(size=(R, V)).astype(np.float32) * 2
    top_k = np.arange(R, dtype=np.int32) % 7 + 1
    kept_k = np.asarray(_truncate(logits, np.ones(R, np.float32), top_k)) > -np.inf
    for row, k, keep in zip(logits, top_k, kept_k):
        assert set(np.flatnonzero(keep)) == set(np.argsort(-row)[:k])

    top_p = np.linspace(0.05, 0.99, R).astype(np.float32)
    kept_p = np.asarray(_truncate(logits, top_p, np.zeros(R, np.int32)))
    for row, p, keep in zip(logits, top_p, kept_p > -np.inf):
        order = np.argsort(-row)
        mass = np.cumsum(_softmax(row)[order])
        n = int(np.searchsorted(mass, p) + 1)  # shortest prefix whose mass reaches p
        assert set(np.flatnonzero(keep)) == set(order[:n])


def test_samples_follow_the_scaled_distribution():
    v, n = 8, 4096
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -3.0, 0.5, -1.0], np.float32)
    temperature = 0.7
    tokens, _ = _sample(jnp.broadcast_to(logits, (n, v)), _knobs(n, temperature=temperature),
                        jnp.full(n, 17))
    freq = np.bincount(np.asarray(tokens), minlength=v) / n
    p = _softmax(logits / temperature)
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) < 5 * sigma + 1e-4), (freq, p)


def test_inverse_cdf_never_picks_a_masked_token():
    logits = np.full((R, V), -np.inf, np.float32)
    logits[:, [1, 3]] = [0.0, 1.0]
    u = np.linspace(0.0, 1.0 - 2 ** -24, R).astype(np.float32)
    picked = np.asarray(jax.jit(inverse_cdf)(logits, u))
    assert set(picked.tolist()) == {1, 3}


@pytest.mark.parametrize("top_p,top_k", [(1.0, 2), (0.5, 0)])
def test_logprob_is_under_the_untruncated_scaled_softmax(top_p, top_k):
    r, v = R, V
    logits = np.random.default_rng(1).normal(size=(r, v)).astype(np.float32)
    tokens, lps = _sample(jnp.asarray(logits), _knobs(r, temperature=0.5, top_p=top_p,
                                                      top_k=top_k), jnp.arange(r))
    tokens = np.asarray(tokens)
    scaled = logits / 0.5
    ref = scaled - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - scaled.max(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(lps), ref[np.arange(r), tokens], atol=1e-5)
    if top_k:
        top2 = np.argsort(-logits, axis=-1)[:, :2]
        assert all(t in row for t, row in zip(tokens, top2))


def test_greedy_is_argmax_with_temperature_one_logprob():
    r, v = R, V
    logits = np.random.default_rng(2).normal(size=(r, v)).astype(np.float32)
    tokens, lps = _sample(jnp.asarray(logits), _knobs(r, temperature=0.3, greedy=True),
                          jnp.zeros(r, jnp.int32))
    np.testing.assert_array_equal(np.asarray(tokens), logits.argmax(-1))
    ref = jax.nn.log_softmax(logits)[np.arange(r), logits.argmax(-1)]
    np.testing.assert_allclose(np.asarray(lps), np.asarray(ref), atol=1e-6)


def test_draws_depend_on_seed_and_position_only():
    logits = np.random.default_rng(3).normal(size=(R, V)).astype(np.float32) * 0.1
    same = _knobs(R, seed=9)
    a, _ = _sample(np.broadcast_to(logits[0], (R, V)), same, np.full(R, 5))
    assert len(set(np.asarray(a).tolist())) == 1  # same seed, same position -> same token
    b, _ = _sample(np.broadcast_to(logits[0], (R, V)), same, np.arange(R))
    assert len(set(np.asarray(b).tolist())) > V // 2  # positions give fresh draws
    # A row's draw does not depend on the other rows of the batch or on its place in it.
    knobs = _knobs(R)  # seeds 0..R-1
    c, _ = _sample(logits, knobs, np.arange(R))
    perm = np.random.default_rng(4).permutation(R)
    d, _ = _sample(logits[perm], jax.tree.map(lambda x: x[perm], knobs), np.arange(R)[perm])
    np.testing.assert_array_equal(np.asarray(c)[perm], np.asarray(d))


def test_greedy_rows_beside_sampled_rows_keep_both_behaviours():
    """A batch of greedy rows only skips the draw; a mixed batch draws. Either way greedy rows
    are the argmax and a sampled row's token does not depend on whether its neighbours are
    greedy (seed and position only)."""
    logits = np.random.default_rng(5).normal(size=(R, V)).astype(np.float32)
    positions = np.arange(R)
    drawn, lp_drawn = _sample(jnp.asarray(logits), _knobs(R), positions)
    mixed = _knobs(R)
    mixed = mixed.replace(greedy=np.arange(R) % 2 == 0)
    tokens, lps = _sample(jnp.asarray(logits), mixed, positions)
    tokens, lps, drawn = np.asarray(tokens), np.asarray(lps), np.asarray(drawn)
    np.testing.assert_array_equal(tokens[0::2], logits.argmax(-1)[0::2])
    np.testing.assert_array_equal(tokens[1::2], drawn[1::2])
    np.testing.assert_allclose(lps[1::2], np.asarray(lp_drawn)[1::2], atol=1e-6)
    assert len(set(drawn.tolist())) > V // 4  # the draws are draws, not the argmax
    assert (drawn != logits.argmax(-1)).mean() > 0.3
