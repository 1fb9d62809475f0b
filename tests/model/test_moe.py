"""Sparse MoE dispatch equals the dense reference; routing replay; frozen router; selection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import init_params, presets
from avalon.model.config import MoeBackend
from avalon.model.moe import capacity_ladder, group_tile, moe_layer, route

CFG = presets.get("tiny")  # latent MoE, 8 experts, top-2, 2 groups keep 1


@pytest.fixture(scope="module")
def layer_params():
    params = init_params(jax.random.key(0), CFG)
    lp = jax.tree.map(lambda a: a[0], params["blocks"][0]["1_moe"])
    # Nonzero correction bias so selection and weights differ (bias is for selection only).
    return {**lp, "router_bias": jax.random.normal(jax.random.key(1), lp["router_bias"].shape)
            * 0.05, "router": lp["router"] * 20,
            # Experts large enough that which ones run visibly changes the output.
            "experts_up": lp["experts_up"] * 10, "experts_down": lp["experts_down"] * 10}


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(2), (3, 11, CFG.hidden_size))


def _numpy_route(lp, x2):
    """Group-limited selection written independently in NumPy (HF 5.24's rules)."""
    s = 1 / (1 + np.exp(-(np.asarray(x2, np.float64) @ np.asarray(lp["router"], np.float64))))
    choice = s + np.asarray(lp["router_bias"], np.float64)
    n, e = choice.shape
    per = e // CFG.n_group
    grouped = choice.reshape(n, CFG.n_group, per)
    gscore = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
    keep = np.argsort(-gscore, axis=-1)[:, :CFG.topk_group]
    mask = np.zeros((n, CFG.n_group), bool)
    np.put_along_axis(mask, keep, True, axis=1)
    choice = np.where(np.repeat(mask, per, axis=1), choice, -np.inf)
    idx = np.argsort(-choice, axis=-1)[:, :CFG.num_experts_per_tok]
    w = np.take_along_axis(s, idx, axis=-1)
    w = w / (w.sum(-1, keepdims=True) + 1e-20) * CFG.routed_scaling_factor
    return idx, w


def test_router_matches_numpy_reference(layer_params, x):
    x2 = x.reshape(-1, CFG.hidden_size)
    idx, w = route(layer_params, x2, CFG)
    ref_idx, ref_w = _numpy_route(layer_params, x2)
    order = np.argsort(np.asarray(idx), axis=-1)
    ref_order = np.argsort(ref_idx, axis=-1)
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(idx), order, -1),
                                  np.take_along_axis(ref_idx, ref_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order, -1),
                               np.take_along_axis(ref_w, ref_order, -1), rtol=1e-5)
    # Group limit: all chosen experts of a token lie in one group (topk_group = 1).
    groups = np.asarray(idx) // (CFG.n_routed_experts // CFG.n_group)
    assert np.all(groups == groups[:, :1])


@pytest.mark.parametrize("backend", [MoeBackend.RAGGED_DOT, MoeBackend.CAPACITY_BUCKETS,
                                     MoeBackend.GROUPED])
def test_sparse_equals_dense(layer_params, x, backend):
    y_dense, idx_dense, _ = moe_layer(layer_params, x, CFG, backend=MoeBackend.DENSE)
    y, idx, _ = jax.jit(lambda p, x: moe_layer(p, x, CFG, backend=backend))(layer_params, x)
    np.testing.assert_array_equal(idx, idx_dense)
    np.testing.assert_allclose(y, y_dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", [MoeBackend.CAPACITY_BUCKETS, MoeBackend.GROUPED])
@pytest.mark.parametrize("forced", [False, True], ids=["routed", "hot_expert"])
def test_sparse_gradients_equal_dense(layer_params, x, forced, backend):
    """The capacity and grouped paths' custom VJPs (gathers both ways) against autodiff of the
    dense reference: gradients of every param and of the input, live routing and a hot expert
    (the largest bucket; for GROUPED, several tiles of one expert)."""
    routing = None
    if forced:
        routing = jnp.broadcast_to(jnp.array([4, 5], jnp.int32), (*x.shape[:2], 2))
    probe = jax.random.normal(jax.random.key(3), x.shape)

    def loss(p, x, backend):
        y, _, _ = moe_layer(p, x, CFG, routing=routing, backend=backend)
        return jnp.sum(y * probe)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
    v_dense, (gp_dense, gx_dense) = grad(layer_params, x, MoeBackend.DENSE)
    v, (gp, gx) = grad(layer_params, x, backend)
    np.testing.assert_allclose(v, v_dense, rtol=1e-5)
    np.testing.assert_allclose(gx, gx_dense, atol=1e-5, rtol=1e-5)
    for key in ("experts_up", "experts_down", "router", "latent_in", "latent_out", "shared_up"):
        scale = float(jnp.abs(gp_dense[key]).max())
        assert scale > 0, key
        np.testing.assert_allclose(gp[key], gp_dense[key], atol=1e-5 * scale, rtol=1e-5,
                                   err_msg=key)


def test_capacity_buckets_survive_a_hot_expert(layer_params, x):
    """All tokens on the same experts: the largest bucket holds them, nothing dropped."""
    n = x.shape[0] * x.shape[1]
    forced = jnp.broadcast_to(jnp.array([4, 5], jnp.int32), (x.shape[0], x.shape[1], 2))
    y_dense, _, _ = moe_layer(layer_params, x, CFG, routing=forced, backend=MoeBackend.DENSE)
    y, _, _ = moe_layer(layer_params, x, CFG, routing=forced, backend=MoeBackend.CAPACITY_BUCKETS)
    np.testing.assert_allclose(y, y_dense, atol=1e-5, rtol=1e-5)
    assert capacity_ladder(n, 2, 8)[-1] == n


def test_replay_reproduces_output(layer_params, x):
    y, idx, _ = moe_layer(layer_params, x, CFG)
    # Replay with a perturbed router: the choices are replayed, weights recomputed live.
    y_replay, idx_replay, _ = moe_layer(layer_params, x, CFG, routing=idx)
    np.testing.assert_array_equal(idx_replay, idx)
    np.testing.assert_allclose(y_replay, y, atol=1e-6)
    other = (idx + 1) % CFG.n_routed_experts
    y_other, idx_other, _ = moe_layer(layer_params, x, CFG, routing=other)
    np.testing.assert_array_equal(idx_other, other)
    assert not np.allclose(y_other, y, atol=1e-4)


def test_frozen_router_gets_no_gradient(layer_params, x):
    def loss(p, cfg):
        return jnp.sum(moe_layer(p, x, cfg)[0] ** 2)

    g_live = jax.grad(loss)(layer_params, CFG)
    g_frozen = jax.grad(loss)(layer_params, CFG.replace(router_frozen=True))
    assert float(jnp.abs(g_live["router"]).max()) > 0
    assert float(jnp.abs(g_frozen["router"]).max()) == 0
    assert float(jnp.abs(g_frozen["router_bias"]).max()) == 0
    # The experts and the input path still learn.
    assert float(jnp.abs(g_frozen["experts_up"]).max()) > 0


def test_group_tile_follows_the_mean_load():
    assert group_tile(66, 8) == 8  # the tests' 33 tokens: several tiles per expert
    assert group_tile(16, 8) == 8  # decode: the smallest tile
    assert group_tile(8192, 8) == 256  # 8 x 512 tokens, top-2: GROUP_TILE
    assert group_tile(1000, 8) == 64  # a power of two <= the mean load (125)
