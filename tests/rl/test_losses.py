"""CISPO and SFT losses against hand-derived NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.rl.config import CapMode, RLConfig
from avalon.rl.losses import cispo_loss, combine_metrics, sft_loss


def _arrays(seed=0, shape=(4, 37)):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.01, 5.0, shape)
    old = logp + rng.normal(0.0, 1.2, shape)  # ratios from ~0.03 to ~30: both clips bind
    adv = rng.normal(0.0, 1.0, shape)
    mask = rng.random(shape) < 0.6
    return [np.asarray(a, np.float32) for a in (logp, old, adv)] + [mask]


def _reference(logp, old, adv, mask, lo, hi, n=None):
    """loss = -(1/N) sum m * clip(rho) * A * logp; d/dlogp = -m * clip(rho) * A / N (the weight
    is a constant: stop-gradient); d/dold = 0."""
    logp, old, adv = (np.asarray(a, np.float64) for a in (logp, old, adv))
    n = mask.sum() if n is None else n
    w = np.clip(np.exp(logp - old), lo, hi)
    loss = -(mask * w * adv * logp).sum() / n
    return loss, -(mask * w * adv) / n


KW = dict(eps_low=0.2, eps_high=5.0)


@pytest.mark.parametrize("cap_mode,hi", [(CapMode.DELTA, 6.0), (CapMode.ABSOLUTE, 5.0)])
def test_cispo_loss_and_gradient_match_hand_derivation(cap_mode, hi):
    logp, old, adv, mask = _arrays()
    fn = lambda lp, o: cispo_loss(lp, o, adv, mask, cap_mode=cap_mode, **KW)[0]
    loss, (g_logp, g_old) = jax.value_and_grad(fn, argnums=(0, 1))(logp, old)
    ref_loss, ref_grad = _reference(logp, old, adv, mask, 0.8, hi)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(g_logp, ref_grad, rtol=1e-5, atol=1e-9)
    # Stop-gradient: nothing flows into the weight, so none into the sampler's log-probs.
    # Without sg, d/d old_logp = m * rho * A * logp / N on every unclipped token.
    np.testing.assert_array_equal(g_old, 0.0)


def test_unclipped_gradient_is_weight_times_advantage_not_more():
    """Without the stop-gradient, d/dlogp[rho * A * logp] = rho * A * (1 + logp): this test
    fails for an implementation that forgets sg."""
    logp = jnp.array([-1.3, -0.4], jnp.float32)
    old = jnp.array([-1.5, -0.2], jnp.float32)  # rho = e^0.2, e^-0.2: inside [0.8, 6]
    adv = jnp.array([0.7, -2.0], jnp.float32)
    mask = jnp.array([True, True])
    g = jax.grad(lambda lp: cispo_loss(lp, old, adv, mask, cap_mode=CapMode.DELTA, **KW)[0])(logp)
    rho = np.exp(np.asarray(logp - old, np.float64))
    np.testing.assert_allclose(g, -rho * np.asarray(adv) / 2, rtol=1e-6)


def test_clipping_changes_weight_never_removes_gradient():
    logp = jnp.array([-0.1, -3.0, -1.0], jnp.float32)
    old = jnp.array([-4.0, -0.5, -1.0], jnp.float32)  # rho = e^3.9 (> 6), e^-2.5 (< 0.8), 1
    adv = jnp.array([1.0, 1.0, 1.0], jnp.float32)
    mask = jnp.ones(3, bool)
    loss, metrics = cispo_loss(logp, old, adv, mask, cap_mode=CapMode.DELTA, **KW)
    g = jax.grad(lambda lp: cispo_loss(lp, old, adv, mask, cap_mode=CapMode.DELTA, **KW)[0])(logp)
    np.testing.assert_allclose(g, [-6.0 / 3, -0.8 / 3, -1.0 / 3], rtol=1e-6)
    assert float(metrics["clipped_frac"]) == pytest.approx(2 / 3)
    assert float(metrics["clipped_high_frac"]) == pytest.approx(1 / 3)
    assert float(metrics["clipped_low_frac"]) == pytest.approx(1 / 3)
    np.testing.assert_allclose(metrics["ratio_max"], np.exp(3.9), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_min"], np.exp(-2.5), rtol=1e-5)


def test_masked_tokens_contribute_nothing():
    logp, old, adv, mask = _arrays(1)
    fn = lambda lp, o, a: cispo_loss(lp, o, a, mask, cap_mode=CapMode.DELTA, **KW)
    (loss, metrics), grads = jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)(
        logp, old, adv)
    # Garbage off the mask (what padding may hold): same loss, same metrics, zero gradient there.
    junk = lambda x, v: np.where(mask, x, v).astype(np.float32)
    (loss2, metrics2), grads2 = jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)(
        junk(logp, -np.inf), junk(old, np.nan), junk(adv, 1e30))
    assert float(loss2) == float(loss)
    for key in metrics:
        assert float(metrics2[key]) == float(metrics[key]), key
    for g, g2 in zip(grads, grads2):
        np.testing.assert_array_equal(g2, g)
        np.testing.assert_array_equal(np.asarray(g2)[~mask], 0.0)


def test_metrics_match_numpy():
    logp, old, adv, mask = _arrays(2)
    _, m = cispo_loss(logp, old, adv, mask, cap_mode=CapMode.DELTA, **KW)
    rho = np.exp(np.asarray(logp, np.float64) - old)[mask]
    assert int(m["loss_tokens"]) == mask.sum()
    np.testing.assert_allclose(m["ratio_mean"], rho.mean(), rtol=1e-5)
    np.testing.assert_allclose(m["ratio_max"], rho.max(), rtol=1e-5)
    np.testing.assert_allclose(m["ratio_min"], rho.min(), rtol=1e-5)
    np.testing.assert_allclose(m["clipped_frac"], ((rho > 6) | (rho < 0.8)).mean(), rtol=1e-6)


def test_token_normalisation_over_the_whole_batch():
    """Micro-batch losses with the batch-wide token count sum to the batch loss (every agent's
    token weighs the same whatever micro-batch or row it sits in); metrics combine exactly."""
    logp, old, adv, mask = _arrays(3, shape=(6, 20))
    kw = dict(cap_mode=CapMode.DELTA, **KW)
    full_loss, full_m = cispo_loss(logp, old, adv, mask, **kw)
    n = int(mask.sum())
    parts = [cispo_loss(logp[i::3], old[i::3], adv[i::3], mask[i::3], num_tokens=n, **kw)
             for i in range(3)]
    np.testing.assert_allclose(sum(float(p[0]) for p in parts), full_loss, rtol=1e-5)
    stacked = {k: jnp.stack([p[1][k] for p in parts]) for k in parts[0][1]}
    combined = combine_metrics(stacked)
    for key in full_m:
        np.testing.assert_allclose(combined[key], full_m[key], rtol=1e-5, err_msg=key)


def test_sft_loss_is_masked_mean_nll():
    logp, _, _, mask = _arrays(4)
    loss, m = sft_loss(logp, mask)
    ref = -(np.asarray(logp, np.float64) * mask).sum() / mask.sum()
    np.testing.assert_allclose(loss, ref, rtol=1e-6)
    np.testing.assert_allclose(m["nll"], ref, rtol=1e-6)
    g = jax.grad(lambda lp: sft_loss(lp, mask)[0])(logp)
    np.testing.assert_allclose(g, -mask.astype(np.float64) / mask.sum(), rtol=1e-6)


def test_config_bounds_and_errors_name_the_field():
    assert RLConfig().clip_bounds == (0.0, 6.0)  # delta-from-1 default, no lower clip
    assert RLConfig(cap_mode=CapMode.ABSOLUTE).clip_bounds == (0.0, 5.0)
    with pytest.raises(ValueError, match=r"RLConfig.eps_high=0.5.*ABSOLUTE"):
        RLConfig(cap_mode=CapMode.ABSOLUTE, eps_high=0.5)
    with pytest.raises(ValueError, match=r"RLConfig.eps_low=1.5"):
        RLConfig(eps_low=1.5)
    with pytest.raises(ValueError, match=r"RLConfig.cap_mode='delta'"):
        RLConfig(cap_mode="delta")
    with pytest.raises(ValueError, match=r"RLConfig.malformed_penalty=0.1"):
        RLConfig(malformed_penalty=0.1)
    with pytest.raises(ValueError, match=r"RLConfig.micro_batches=0"):
        RLConfig(micro_batches=0)
    with pytest.raises(ValueError, match=r"RLConfig.lr=nan"):
        RLConfig(lr=float("nan"))
    with pytest.raises(ValueError, match=r"RLConfig.beta=0"):
        RLConfig(beta=0)
