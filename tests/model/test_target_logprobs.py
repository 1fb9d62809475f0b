"""The fused target log-prob / entropy (custom VJP) equals its autodiff reference: values, and
the gradient of any weighting of the log-probs, in float64 and float32; the entropy carries no
gradient in either."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model.target_logprobs import target_logp_entropy, target_logp_entropy_reference


def _inputs(dtype, shape=(3, 7), vocab=50):
    logits = 4.0 * jax.random.normal(jax.random.key(0), (*shape, vocab), dtype)
    # One row far from zero and one with a dominant entry: the max shift must be exact.
    logits = logits.at[0, 0].add(300.0).at[1, 2, 5].add(60.0)
    targets = jax.random.randint(jax.random.key(1), shape, 0, vocab)
    weights = jax.random.normal(jax.random.key(2), shape, dtype)
    return logits, targets, weights


@pytest.fixture(scope="module", autouse=True)
def float64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("dtype,tol", [(jnp.float64, 1e-12), (jnp.float32, 5e-5)])
def test_values_and_gradients_equal_reference(dtype, tol):
    """The reference runs in float64 on the same inputs; float32's tolerance is its rounding
    at logits of ~300 (the shifted row)."""
    logits, targets, w = _inputs(dtype)
    f64 = lambda a: a.astype(jnp.float64)  # noqa: E731
    got = jax.jit(target_logp_entropy)(logits, targets)
    want = jax.jit(target_logp_entropy_reference)(f64(logits), targets)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)

    def loss(fn, lg):
        logp, ent = fn(lg, targets)
        return jnp.sum(f64(w) * f64(logp)) + 0.0 * jnp.sum(ent)

    g = jax.jit(jax.grad(lambda lg: loss(target_logp_entropy, lg)))(logits)
    g_ref = jax.jit(jax.grad(lambda lg: loss(target_logp_entropy_reference, lg)))(f64(logits))
    assert g.dtype == dtype
    np.testing.assert_allclose(g, g_ref, rtol=tol, atol=tol)
    # The entropy alone has no gradient (a diagnostic), as in the reference.
    for fn in (target_logp_entropy, target_logp_entropy_reference):
        g_ent = jax.grad(lambda lg, fn=fn: jnp.sum(fn(lg, targets)[1]))(logits)
        assert not np.any(np.asarray(g_ent))


def test_matches_log_softmax():
    logits, targets, _ = _inputs(jnp.float32)
    logp, ent = target_logp_entropy(logits, targets)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    np.testing.assert_allclose(logp, jnp.take_along_axis(lsm, targets[..., None], -1)[..., 0],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(lsm) * lsm, -1), rtol=1e-5, atol=1e-5)
