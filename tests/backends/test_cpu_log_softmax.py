"""The update step's CPU log-prob kernel (`backends/cpu_log_softmax.py`) against the reference,
`rl.logprobs.log_softmax_stats`: log-probs, entropies and the log-probs' gradient for rows that
end in a partial vector, a vocabulary of SmolLM2's size, large logits, a target at either end;
a target outside the vocabulary as the reference's gather gives it; the update step passing it
on one CPU device and its step equal to XLA's (the fallback without a compiler:
test_cpu_build.py).

`.ci/run` sets AVALON_REQUIRE_CPU_KERNEL=1, so in CI a kernel that does not build fails these
tests; elsewhere (a machine without a C++ compiler) they skip."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.backends import cpu_log_softmax
from avalon.backends.training import TrainingPlatform
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.logprobs import log_softmax_stats
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.backends.helpers import assert_steps_agree, sft_batch


@pytest.fixture(autouse=True)
def kernel(cpu_log_softmax_kernel):
    """Every test here needs the kernel (tests/conftest.py: fail in CI, skip without c++)."""


@pytest.mark.parametrize("shape,v,scale", [((3, 5), 37, 1.0), ((2, 64), 49152, 4.0),
                                           ((7,), 16, 30.0), ((1, 1), 1, 1.0)])
def test_logprobs_entropy_and_gradient_equal_the_reference(shape, v, scale):
    k1, k2, k3 = jax.random.split(jax.random.key(v), 3)
    logits = scale * jax.random.normal(k1, (*shape, v))
    targets = jax.random.randint(k2, shape, 0, v).at[..., 0].set(v - 1)
    probe = jax.random.normal(k3, shape)

    def loss(stats):
        def f(x):
            logp, entropy = stats(x, targets)
            return jnp.sum(logp * probe) + jnp.sum(entropy), (logp, entropy)
        return jax.jit(jax.value_and_grad(f, has_aux=True))(logits)

    (_, (logp, entropy)), grad = loss(cpu_log_softmax.log_softmax_stats)
    (_, (ref_logp, ref_entropy)), ref_grad = loss(log_softmax_stats)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    # The gradient is the target's log-prob's alone: sum over the vocabulary is 0 per row.
    np.testing.assert_allclose(jnp.sum(grad, axis=-1), 0.0, atol=1e-5)


def test_a_long_row_is_as_close_to_float64_as_the_reference():
    """SmolLM2's vocabulary (49,152 logits a row, spread 4): the kernel's sums are no further
    from float64 than XLA's."""
    k1, k2 = jax.random.split(jax.random.key(1))
    logits = 4.0 * jax.random.normal(k1, (64, 49152))
    targets = jax.random.randint(k2, (64,), 0, 49152)
    x = np.asarray(logits, np.float64)
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    lse = m[:, 0] + np.log(e.sum(-1))
    want = {"logp": x[np.arange(64), np.asarray(targets)] - lse,
            "entropy": lse - (e * x).sum(-1) / e.sum(-1)}
    got = dict(zip(want, cpu_log_softmax.log_softmax_stats(logits, targets)))
    ref = dict(zip(want, jax.jit(log_softmax_stats)(logits, targets)))
    for key in want:
        err = np.abs(np.asarray(got[key], np.float64) - want[key]).max()
        ref_err = np.abs(np.asarray(ref[key], np.float64) - want[key]).max()
        assert err <= max(1.5 * ref_err, 1e-6), (key, err, ref_err)


def test_a_target_outside_the_vocabulary_is_what_the_reference_gives():
    targets = jnp.asarray([3, 20, -1, -20, -21], jnp.int32)  # in, past the end, from the end
    logits = jax.random.normal(jax.random.key(0), (5, 20))
    logp, _ = cpu_log_softmax.log_softmax_stats(logits, targets)
    ref, _ = log_softmax_stats(logits, targets)
    np.testing.assert_array_equal(np.isnan(logp), np.isnan(ref))
    np.testing.assert_allclose(logp, ref, rtol=1e-6)  # NaNs in the same places compare equal


def test_update_step_on_one_cpu_uses_the_kernel_and_equals_xlas_step():
    cfg = M.presets.get("tiny", pattern="*-")
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32)
    one = TrainingPlatform.for_mesh(None, cfg)
    assert one.log_softmax is cpu_log_softmax.log_softmax_stats
    fused = make_update_step(cfg, rl, platform=one)
    plain = make_update_step(cfg, rl, platform=dataclasses.replace(one, log_softmax=None))
    assert_steps_agree(fused, plain, M.init_params(jax.random.key(0), cfg), sft_batch(cfg),
                       keys=("loss", "nll", "grad_norm", "entropy"))


def test_several_devices_keep_xlas_reductions():
    cfg = M.presets.get("tiny")
    assert TrainingPlatform.for_mesh(make_mesh({"data": 8}), cfg).log_softmax is None


def test_one_cpu_keeps_logits_that_fit_and_its_step_equals_the_recomputing_one():
    v = 49152  # SmolLM2: a 1,024-position row's logits are 192 MiB, 8 x 4,096 positions' 6 GiB
    cfg = M.presets.get("tiny", pattern="*-")
    one = TrainingPlatform.for_mesh(None, cfg)
    assert one.keep_logits(1, 1024, v)
    assert not one.keep_logits(8, 4096, v)
    assert not TrainingPlatform.for_mesh(make_mesh({"data": 8}), cfg).keep_logits(1, 8, 8)
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=16)  # 64 positions
    kept = make_update_step(cfg, rl, platform=one)
    chunked = make_update_step(cfg, rl, platform=dataclasses.replace(one, keep_logits_bytes=0))
    assert_steps_agree(kept, chunked, M.init_params(jax.random.key(0), cfg), sft_batch(cfg),
                       keys=("loss", "nll", "grad_norm", "entropy"))
