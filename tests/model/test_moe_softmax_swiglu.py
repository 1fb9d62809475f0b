"""The Qwen3-MoE layer (softmax router, SwiGLU experts, no shared expert) through every dispatch
path, against the dense reference and against NumPy.

The MoE backends share one activation contract (`activations.py`): a fused [gate | up] weight
and `activate` / `activate_grad`. Checked here: the activation's hand-written gradient against
autodiff; the softmax router against a NumPy reference (with and without renormalisation);
every single-device backend's output and (for the custom-VJP ones) gradients against DENSE;
the expert-parallel `shard_map` on a 2 x 4 mesh; routing replay. (The engine's CPU layouts
with the gate and up fused once: tests/backends/test_cpu_out_in.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from avalon import sharding
from avalon.model import init_params, presets
from avalon.model.activations import activate, activate_grad
from avalon.model.config import Activation, MoeBackend
from avalon.model.moe import moe_layer, route
from avalon.model.params import moe_specs

CFG = presets.get("tiny_qwen3_moe", moe_dispatch_chunk=6)


@pytest.fixture(scope="module")
def lp():
    params = init_params(jax.random.key(0), CFG)
    p = jax.tree.map(lambda a: a[0], params["blocks"][1]["0_moe"])
    assert "router_bias" not in p and "shared_up" not in p and "experts_gate" in p
    return {**p, "router": p["router"] * 20, "experts_up": p["experts_up"] * 10,
            "experts_gate": p["experts_gate"] * 10, "experts_down": p["experts_down"] * 10}


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(2), (16, 6, CFG.hidden_size))


@pytest.mark.parametrize("act", list(Activation))
def test_activation_gradient_equals_autodiff(act):
    f = 6
    pre = jax.random.normal(jax.random.key(4), (5, 2 * f if act == Activation.SWIGLU else f))
    g = jax.random.normal(jax.random.key(5), (5, f))
    _, vjp = jax.vjp(lambda p: activate(act, p), pre)
    np.testing.assert_allclose(activate_grad(act, pre, g), vjp(g)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("renormalise", [True, False])
def test_softmax_router_matches_numpy(lp, x, renormalise):
    cfg = CFG.replace(norm_topk_prob=renormalise)
    x2 = x.reshape(-1, cfg.hidden_size)
    idx, w = route(lp, x2, cfg)
    logits = np.asarray(x2, np.float64) @ np.asarray(lp["router"], np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref_idx = np.argsort(-p, axis=-1)[:, :cfg.num_experts_per_tok]
    ref_w = np.take_along_axis(p, ref_idx, -1)
    if renormalise:
        ref_w = ref_w / ref_w.sum(-1, keepdims=True)
    np.testing.assert_array_equal(np.sort(np.asarray(idx), -1), np.sort(ref_idx, -1))
    order, ref_order = np.argsort(np.asarray(idx), -1), np.argsort(ref_idx, -1)
    np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order, -1),
                               np.take_along_axis(ref_w, ref_order, -1), rtol=1e-5)


def _loss(p, x, backend, cfg=CFG, routing=None):
    y, _, _ = moe_layer(p, x, cfg, backend=backend, routing=routing)
    return jnp.sum(jnp.sin(y) * y), y


@pytest.mark.parametrize("backend", [MoeBackend.RAGGED_DOT, MoeBackend.CAPACITY_BUCKETS,
                                     MoeBackend.GROUPED])
@pytest.mark.parametrize("forced", [False, True], ids=["routed", "hot_expert"])
def test_backends_equal_dense_with_gradients(lp, x, backend, forced):
    routing = jnp.broadcast_to(jnp.array([3, 6], jnp.int32), (*x.shape[:2], 2)) \
        if forced else None
    grad = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True),
                   static_argnums=(2,), static_argnames=("routing",)) if not forced else \
        jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)
    (l_ref, y_ref), (gp_ref, gx_ref) = grad(lp, x, MoeBackend.DENSE, routing=routing)
    (loss, y), (gp, gx) = grad(lp, x, backend, routing=routing)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, l_ref, rtol=1e-5)
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-4, atol=1e-5)
    for key in ("experts_gate", "experts_up", "experts_down", "router"):
        scale = float(jnp.abs(gp_ref[key]).max())
        assert scale > 0, key
        np.testing.assert_allclose(gp[key], gp_ref[key], atol=1e-5 * scale, rtol=1e-4,
                                   err_msg=key)


def test_expert_parallel_equals_dense(lp, x):
    mesh = sharding.make_mesh({"fsdp": 2, "expert": 4})
    (l_ref, y_ref), g_ref = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(
        lp, x, MoeBackend.DENSE)

    def sharded(p, x):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(
                p, x, MoeBackend.RAGGED_DOT)

    p_sh = {k: NamedSharding(mesh, sharding.logical_to_spec(
        s.axes, sharding.TRAIN_RULES, mesh, s.shape)) for k, s in moe_specs(CFG).items()}
    (loss, y), g = jax.jit(sharded, in_shardings=(p_sh, NamedSharding(
        mesh, PartitionSpec(("fsdp", "expert")))))(lp, x)
    np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(loss, l_ref, rtol=2e-5)
    for key in ("experts_gate", "experts_up", "experts_down", "router"):
        np.testing.assert_allclose(g[0][key], g_ref[0][key], rtol=2e-4, atol=2e-5,
                                   err_msg=key)
    np.testing.assert_allclose(g[1], g_ref[1], rtol=2e-4, atol=2e-5)


def test_replay_recomputes_softmax_gates(lp, x):
    y, idx, _ = moe_layer(lp, x, CFG)
    y_replay, idx_replay, _ = moe_layer(lp, x, CFG, routing=idx)
    np.testing.assert_array_equal(idx_replay, idx)
    np.testing.assert_allclose(y_replay, y, atol=1e-6)
    other = (idx + 1) % CFG.n_routed_experts
    y_other, _, _ = moe_layer(lp, x, CFG, routing=other)
    assert not np.allclose(y_other, y, atol=1e-4)
