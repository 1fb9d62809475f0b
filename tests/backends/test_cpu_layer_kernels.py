"""The update step's CPU RMSNorm and SwiGLU (`backends/cpu_rms_norm.py`, `cpu_swiglu.py`)
against the model's own (`model.norms.rms_norm`, jax.nn.silu(gate) * up) and float64: values
and every gradient, row widths with and without a partial vector, rows that split over parts
and not, extreme gates; the model uses them only as `Ops.fp32_kernel` says (float32 arrays); the
update step on one CPU device with them against the step without, and without them on several."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.backends import cpu_rms_norm, cpu_swiglu
from avalon.backends.training import TrainingPlatform
from avalon.model.norms import rms_norm
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.backends.helpers import assert_steps_agree, sft_batch


@pytest.fixture(autouse=True)
def kernel(cpu_layer_kernels):
    """Every test here needs the kernels (tests/conftest.py: fail in CI, skip without c++)."""


def _f64_rms_norm(x, w, eps):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


@pytest.mark.parametrize("shape", [(3, 5, 576), (130, 20), (1, 7)])
def test_rms_norm_and_its_gradients_equal_the_models(shape):
    d = shape[-1]
    x = 3.0 * jax.random.normal(jax.random.key(0), shape)
    w = 1.0 + 0.3 * jax.random.normal(jax.random.key(1), (d,))
    dy = jax.random.normal(jax.random.key(2), shape)
    eps = 1e-5
    got = jax.jit(cpu_rms_norm.rms_norm, static_argnums=2)(x, w, eps)
    want = rms_norm(x, w, eps)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got, _f64_rms_norm(x, w, eps), rtol=2e-6, atol=1e-6)

    def vjp(fn):
        return jax.jit(lambda x, w: jax.vjp(lambda x, w: fn(x, w, eps), x, w)[1](dy))(x, w)
    (gx, gw), (rx, rw) = vjp(cpu_rms_norm.rms_norm), vjp(rms_norm)
    np.testing.assert_allclose(gx, rx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, rw, rtol=1e-5, atol=1e-5 * np.abs(rw).max())
    # float64 gradient of w: sum over rows of dy * x * rstd
    x64 = np.asarray(x, np.float64).reshape(-1, d)
    xh = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + eps)
    gw64 = (np.asarray(dy, np.float64).reshape(-1, d) * xh).sum(0)
    assert np.abs(np.asarray(gw) - gw64).max() <= 2 * np.abs(np.asarray(rw) - gw64).max() + 1e-6


@pytest.mark.parametrize("n", [1536 * 7, 37, 1 << 15])
def test_swiglu_and_its_gradients_equal_the_models(n):
    gate = 4.0 * jax.random.normal(jax.random.key(0), (n,))
    gate = gate.at[:6].set(jnp.array([-120.0, -88.0, -30.0, 0.0, 30.0, 120.0]))
    up = jax.random.normal(jax.random.key(1), (n,))
    dh = jax.random.normal(jax.random.key(2), (n,))

    def ref(g, u):
        return jax.nn.silu(g) * u
    got, want = jax.jit(cpu_swiglu.swiglu)(gate, up), jax.jit(ref)(gate, up)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    g64, u64 = np.asarray(gate, np.float64), np.asarray(up, np.float64)
    np.testing.assert_allclose(got, g64 * u64 / (1 + np.exp(-g64)), rtol=1e-6, atol=1e-30)

    def vjp(fn):
        return jax.jit(lambda g, u: jax.vjp(fn, g, u)[1](dh))(gate, up)
    for a, b in zip(vjp(cpu_swiglu.swiglu), vjp(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_shape_or_dtype_it_does_not_take_is_a_clear_error():
    with pytest.raises(ValueError, match="cpu_rms_norm: .* must be float32 with w"):
        cpu_rms_norm.rms_norm(jnp.ones((2, 8)), jnp.ones((4,)), 1e-5)
    with pytest.raises(ValueError, match="cpu_swiglu: .* float32 of one shape"):
        cpu_swiglu.swiglu(jnp.ones((2, 8)), jnp.ones((2, 8), jnp.bfloat16))


def test_the_model_uses_them_only_for_float32():
    seen = []
    def norm(x, w, eps):
        seen.append("rms_norm")
        return cpu_rms_norm.rms_norm(x, w, eps)
    x, w = jnp.ones((2, 16)), jnp.ones((16,))
    ops = M.Ops(rms_norm=norm)
    np.testing.assert_allclose(rms_norm(x, w, 1e-5, ops), cpu_rms_norm.rms_norm(x, w, 1e-5))
    rms_norm(x.astype(jnp.bfloat16), w, 1e-5, ops)  # not float32: the model's own
    rms_norm(x, w, 1e-5)  # without the ops: the model's own
    assert seen == ["rms_norm"]


def test_update_step_on_one_cpu_uses_them_and_equals_xlas_step():
    cfg = M.presets.get("tiny_llama")  # SwiGLU MLP, q/k norms: both kernels, 4-D norm inputs
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32)
    one = TrainingPlatform.for_mesh(None, cfg)
    assert one.ops.rms_norm is cpu_rms_norm.rms_norm and one.ops.swiglu is cpu_swiglu.swiglu
    several = TrainingPlatform.for_mesh(make_mesh({"data": 8}), cfg)
    assert several.ops.rms_norm is None and several.ops.swiglu is None
    fast = make_update_step(cfg, rl, platform=one)
    own = dataclasses.replace(one, ops=dataclasses.replace(one.ops, rms_norm=None, swiglu=None))
    plain = make_update_step(cfg, rl, platform=own)
    assert_steps_agree(fast, plain, M.init_params(jax.random.key(0), cfg), sft_batch(cfg),
                       keys=("loss", "nll", "grad_norm", "entropy"))
