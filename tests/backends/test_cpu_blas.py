"""The update step's products on MKL (`backends/cpu_blas.py`) against references: `product`,
plain and the tied head's (weight stored transposed), values and both gradients, against
float64 NumPy and XLA's product for shapes split over threads or not, thin and empty ones;
`model.dense`, `dense_head` and `tied_head` under the platform product against the same calls
without it; the update step with the products on MKL against the step with XLA's; where it
does not apply.

Skipped where MKL is not installed (the optional `cpu` extra); `.ci/run` installs it and sets
AVALON_REQUIRE_CPU_KERNEL=1, so in CI these fail instead."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.backends import cpu_blas, cpu_products
from avalon.backends.training import TrainingPlatform
from avalon.model import dense as D
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.backends.helpers import assert_steps_agree, sft_batch


@pytest.fixture(autouse=True)
def kernel(cpu_blas_kernel):
    """Every test here needs MKL and the kernel (tests/conftest.py)."""


def _f64(a):
    return np.asarray(a, np.float64)


@pytest.mark.parametrize("m,k,n", [(1024, 576, 1536), (37, 70, 45), (5, 1, 3), (64, 300, 4099),
                                   (3, 0, 4), (0, 8, 5)])
def test_matmul_and_its_gradients_equal_float64(m, k, n):
    kx, kw, kg = jax.random.split(jax.random.key(m * 7 + n), 3)
    x, w = jax.random.normal(kx, (m, k)), jax.random.normal(kw, (k, n))
    g = jax.random.normal(kg, (m, n))
    y, vjp = jax.vjp(jax.jit(lambda x, w: cpu_blas.product(x, w, False)), x, w)
    dx, dw = vjp(g)
    tol = dict(rtol=2e-5, atol=2e-5 * max(1, k) ** 0.5)
    np.testing.assert_allclose(y, _f64(x) @ _f64(w), **tol)
    np.testing.assert_allclose(dx, _f64(g) @ _f64(w).T, rtol=2e-5, atol=2e-5 * max(1, n) ** 0.5)
    np.testing.assert_allclose(dw, _f64(x).T @ _f64(g), rtol=2e-5, atol=2e-5 * max(1, m) ** 0.5)


@pytest.mark.parametrize("m,k,n", [(512, 576, 4096), (9, 33, 17)])
def test_tied_head_product_and_its_gradients_equal_float64(m, k, n):
    """transpose_w: x [m, k] against the embedding [n, k] as stored."""
    kx, kw, kg = jax.random.split(jax.random.key(n), 3)
    x, e = jax.random.normal(kx, (m, k)), jax.random.normal(kw, (n, k))
    g = jax.random.normal(kg, (m, n))
    y, vjp = jax.vjp(jax.jit(lambda x, e: cpu_blas.product(x, e, True)), x, e)
    dx, de = vjp(g)
    np.testing.assert_allclose(y, _f64(x) @ _f64(e).T, rtol=2e-5, atol=1e-3)
    np.testing.assert_allclose(dx, _f64(g) @ _f64(e), rtol=2e-5, atol=1e-3)
    np.testing.assert_allclose(de, _f64(g).T @ _f64(x), rtol=2e-5, atol=1e-3)


def _value_and_grads(fn, *args):
    def loss(*a):
        y = fn(*a)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size).reshape(y.shape))), y
    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args))),
                                               has_aux=True))(*args)
    return y, grads


@pytest.mark.parametrize("which", ["dense", "dense_two_axes", "dense_head", "tied_head"])
def test_model_products_on_mkl_equal_xlas(which):
    """The model's projections with MKL's products (`Ops.product`, `Ops.head_product`) against
    the model's own einsums, value and gradients."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (2, 30, 48))
    fns = {"dense": (lambda x, w, ops: D.dense(x, w, ops=ops), (48, 80)),
           "dense_two_axes": (lambda x, w, ops: D.dense(x.reshape(2, 30, 4, 12), w, 2, ops),
                              (4, 12, 24)),
           "dense_head": (D.dense_head, (48, 500)),
           "tied_head": (D.tied_head, (500, 48))}
    fn, shape = fns[which]
    w = jax.random.normal(kw, shape)
    mkl = M.Ops(product=cpu_products.mkl_product, head_product=cpu_products.mkl_head_product)

    y, grads = _value_and_grads(lambda x, w: fn(x, w, mkl), x, w)
    y_ref, grads_ref = _value_and_grads(lambda x, w: fn(x, w, M.PLAIN), x, w)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, grads_ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_update_step_on_mkl_equals_the_step_on_xlas_products():
    """One SFT step of a model with attention, an MLP and a tied head: the products on MKL
    (make_update_step on one CPU device) against XLA's."""
    cfg = M.presets.get("tiny", pattern="*-", tie_word_embeddings=True)
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32)
    params = M.init_params(jax.random.key(0), cfg)
    batch = sft_batch(cfg)
    on_mkl = make_update_step(cfg, rl)
    assert cpu_blas.TARGET in on_mkl.step_fn.lower(on_mkl.init_state(params), batch).as_text()
    xla = TrainingPlatform.for_mesh(None, cfg)
    xla = dataclasses.replace(xla, ops=dataclasses.replace(
        xla.ops, product=cpu_products.product, head_product=cpu_products.head_product))
    plain = make_update_step(cfg, rl, platform=xla)
    assert cpu_blas.TARGET not in plain.step_fn.lower(plain.init_state(params), batch).as_text()
    assert_steps_agree(on_mkl, plain, params, batch)


def test_a_one_device_mesh_runs_all_three_kernels():
    """avalon.main builds a mesh even for one CPU device (configs: mesh data=1): the update step
    on it traces the products on MKL, the log-prob kernel and the attention kernel."""
    from avalon.model.config import AttentionImpl

    cfg = M.presets.get("tiny", pattern="*-", tie_word_embeddings=True,
                        attention_impl=AttentionImpl.FLASH)
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32)
    step = make_update_step(cfg, rl, mesh=make_mesh({"data": 1}, devices=jax.devices()[:1]))
    params = M.init_params(jax.random.key(0), cfg)
    hlo = step.step_fn.lower(step.init_state(params), sft_batch(cfg)).as_text()
    for target in (cpu_blas.TARGET, "avalon_logprobs_fwd", "avalon_attention_bwd"):
        assert target in hlo, target


def test_several_devices_keep_xlas_products():
    cfg = M.presets.get("tiny")
    assert TrainingPlatform.for_mesh(None, cfg).ops.product is cpu_products.mkl_product
    assert TrainingPlatform.for_mesh(make_mesh({"data": 8}), cfg).ops.product is (
        cpu_products.product)
