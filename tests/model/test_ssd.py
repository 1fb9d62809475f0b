"""The chunked SSD equals the sequential scan (float64), with and without packed segments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model.ssd import segsum, segsum_cumsum, ssd_chunked, ssd_sequential, ssd_step


@pytest.fixture(scope="module", autouse=True)
def float64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _inputs(seed=0, b=2, t=37, h=4, p=3, n=5, g=2):
    rng = np.random.default_rng(seed)
    return dict(
        x=jnp.asarray(rng.normal(size=(b, t, h, p))),
        dt=jnp.asarray(rng.uniform(0.01, 0.5, size=(b, t, h))),
        A=-jnp.asarray(rng.uniform(0.5, 2.0, size=(h,))),
        B=jnp.asarray(rng.normal(size=(b, t, g, n))),
        C=jnp.asarray(rng.normal(size=(b, t, g, n))),
        D=jnp.asarray(rng.normal(size=(h,))),
    ), jnp.asarray(rng.normal(size=(b, h, p, n)))


@pytest.mark.parametrize("chunk", [8, 5, 64])
def test_chunked_equals_sequential(chunk):
    # t=37 is not a multiple of any chunk; G=2 < H=4; nonzero initial state.
    kw, h0 = _inputs()
    y_ref, s_ref = ssd_sequential(**kw, h0=h0)
    y, s = ssd_chunked(**kw, chunk_size=chunk, h0=h0)
    assert y.dtype == jnp.float64
    np.testing.assert_allclose(y, y_ref, atol=1e-12, rtol=0)
    np.testing.assert_allclose(s, s_ref, atol=1e-12, rtol=0)


def test_chunked_without_initial_state():
    kw, _ = _inputs(seed=1)
    y_ref, s_ref = ssd_sequential(**kw)
    y, s = ssd_chunked(**kw, chunk_size=8)
    np.testing.assert_allclose(y, y_ref, atol=1e-12, rtol=0)
    np.testing.assert_allclose(s, s_ref, atol=1e-12, rtol=0)


def test_segments_equal_separate_runs():
    """Packed segments reset the state: each segment equals a run of that segment alone."""
    kw, h0 = _inputs(seed=2, b=1, t=30)
    bounds = [0, 7, 8, 21, 30]  # a 1-token segment and boundaries inside and at chunk edges
    seg = np.zeros((1, 30), np.int32)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        seg[0, a:b] = i + 1
    y_ref_packed, _ = ssd_sequential(**kw, segment_ids=jnp.asarray(seg))
    y, _ = ssd_chunked(**kw, chunk_size=8, segment_ids=jnp.asarray(seg))
    np.testing.assert_allclose(y, y_ref_packed, atol=1e-12, rtol=0)
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = {k: (v[:, a:b] if v.ndim > 1 else v) for k, v in kw.items()}
        y_alone, _ = ssd_sequential(**part)
        np.testing.assert_allclose(y[:, a:b], y_alone, atol=1e-12, rtol=0)


def test_recurrent_step_equals_scan():
    kw, h0 = _inputs(seed=3, t=9)
    y_ref, s_ref = ssd_sequential(**kw, h0=h0)
    state, ys = h0, []
    for t in range(9):
        y, state = ssd_step(state, kw["x"][:, t], kw["dt"][:, t], kw["A"], kw["B"][:, t],
                            kw["C"][:, t], kw["D"])
        ys.append(y)
    np.testing.assert_allclose(jnp.stack(ys, 1), y_ref, atol=1e-12, rtol=0)
    np.testing.assert_allclose(state, s_ref, atol=1e-12, rtol=0)


def test_gradient_is_finite_and_matches_sequential():
    kw, h0 = _inputs(seed=4, t=20)
    seg = jnp.asarray(np.repeat([[1] * 9 + [2] * 11], 2, axis=0))

    def loss(fn, x, **extra):
        return jnp.sum(fn(**{**kw, "x": x}, h0=h0, segment_ids=seg, **extra)[0] ** 2)

    g = jax.grad(lambda x: loss(ssd_chunked, x, chunk_size=8))(kw["x"])
    g_ref = jax.grad(lambda x: loss(ssd_sequential, x))(kw["x"])
    assert bool(jnp.all(jnp.isfinite(g)))
    np.testing.assert_allclose(g, g_ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_segsum_matmul_equals_masked_cumsum(dtype):
    """The triangular-matmul segment sum equals the masked cumulative sum it replaced: values
    (the same -inf above the diagonal) and gradients, in float64 and float32."""
    a = -jnp.asarray(np.random.default_rng(5).uniform(0.0, 2.0, size=(3, 2, 16)), dtype)
    got, want = jax.jit(segsum)(a), segsum_cumsum(a)
    np.testing.assert_array_equal(jnp.isneginf(got), jnp.isneginf(want))
    tol = 1e-12 if dtype == jnp.float64 else 1e-5
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)

    def loss(fn, a):
        return jnp.sum(jnp.exp(fn(a)) * jnp.arange(16, dtype=dtype))

    np.testing.assert_allclose(jax.grad(lambda a: loss(segsum, a))(a),
                               jax.grad(lambda a: loss(segsum_cumsum, a))(a), atol=tol, rtol=tol)
