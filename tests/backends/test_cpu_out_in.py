"""The output-first layout (`backends/cpu_out_in.py`, the engine's CPU decode layout without the
kernel) against the model's references: `dense` on an `OutIn` weight equals the einsum on the
[in, out] weight on either side of `OUT_IN_ROWS` (and under a mesh, where `dense` reads it back
as [in, out]); the MoE layer in this layout (`decode.out_in_params`: projections and routed
experts output-first, SwiGLU's gate and up fused once) equals the dense dispatch."""

import jax
import numpy as np
import pytest

from avalon.backends.cpu_gemm import Packed
from avalon.backends.cpu_out_in import OUT_IN_ROWS, OutIn
from avalon.backends.decode import out_in_params
from avalon.model import init_params, presets
from avalon.model.config import MoeBackend
from avalon.model.dense import dense, dense_einsum
from avalon.model.moe import moe_layer
from avalon.sharding import TRAIN_RULES, make_mesh, use_rules

CASES = [  # (x shape, w shape, n_in), as tests/model/test_dense.py
    ((3, 5, 8), (8, 6), 1),  # [b, t, d] @ [d, f]: the LM head, Mamba in_proj, MLP
    ((3, 5, 8), (8, 2, 4), 1),  # [b, t, d] @ [d, h, k]: attention q/k/v
    ((3, 5, 2, 4), (2, 4, 8), 2),  # [b, t, h, k] @ [h, k, d]: attention o, Mamba out
    ((7, 8), (8, 6), 1),  # already 2-D (the MTP head on flat tokens)
]
TINY = presets.get("tiny")  # latent MoE, 8 experts, top-2, 2 groups keep 1
QWEN = presets.get("tiny_qwen3_moe")  # softmax router, SwiGLU experts, no shared expert


def _moe_layer_params(cfg, block, key):
    """One MoE layer of `cfg`'s random params, router and experts scaled so which experts run
    visibly changes the output."""
    lp = jax.tree.map(lambda a: a[0], init_params(jax.random.key(0), cfg)["blocks"][block][key])
    scaled = {"router": 20, "experts_up": 10, "experts_down": 10, "experts_gate": 10}
    return {n: a * scaled.get(n, 1) for n, a in lp.items()}


@pytest.mark.parametrize("rows", [5, OUT_IN_ROWS, OUT_IN_ROWS + 1], ids=["decode", "edge", "many"])
@pytest.mark.parametrize("xs,ws,n_in", CASES)
def test_out_in_weight_equals_einsum(xs, ws, n_in, rows):
    """Both product forms (w_t @ x.T for few rows, x @ w_t.T for many) against the reference;
    the weight is stacked first ([2, *in, *out]) and unstacked as a pytree, as the engine's
    layer blocks are."""
    x = jax.random.normal(jax.random.key(5), (rows, *xs[len(xs) - n_in:]))
    stack = jax.random.normal(jax.random.key(6), (2, *ws))
    w = OutIn.of(stack, n_in, lead=1)
    assert w.shape == stack.shape and w.t.shape[0] == 2
    one = jax.tree.map(lambda a: a[1], w)
    assert one.shape == ws and one.dtype == stack.dtype
    np.testing.assert_array_equal(one.as_in_out(), stack[1])
    got = jax.jit(dense, static_argnums=2)(x, one, n_in)
    np.testing.assert_allclose(got, dense_einsum(x, stack[1], n_in), rtol=1e-6, atol=1e-5)


def test_out_in_weight_under_a_mesh_equals_einsum():
    mesh = make_mesh({"data": 2, "tensor": 4})
    x = jax.random.normal(jax.random.key(7), (4, 5, 8))
    w = jax.random.normal(jax.random.key(8), (8, 2, 4))

    def fn(x, t):
        with use_rules(mesh, TRAIN_RULES):
            return dense(x, OutIn(t, (8,), (2, 4)))

    got = jax.jit(fn)(x, OutIn.of(w, 1).t)
    np.testing.assert_allclose(got, dense_einsum(x, w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tokens", [(1, 1), (4, 1), (3, 11), (8, 64)],
                         ids=["b1", "b4_decode", "prefill", "tiles_of_128"])
def test_out_in_experts_equal_dense(tokens):
    """The grouped loop's out-in forward equals the dense reference on [in, out] weights, with
    few rows (w_t @ x.T) and with whole tiles of many (x @ w_t.T)."""
    layer_params = _moe_layer_params(TINY, 0, "1_moe")
    x = jax.random.normal(jax.random.key(9), (*tokens, TINY.hidden_size))
    cfg = TINY.replace(moe_backend=MoeBackend.GROUPED)
    params = {"blocks": [{"0_moe": jax.tree.map(lambda a: a[None], layer_params)}]}
    one_layer = cfg.replace(pattern="E")  # the config the one-block params describe
    out_in = jax.tree.map(lambda a: a[0], out_in_params(one_layer, params)["blocks"][0]["0_moe"])
    assert isinstance(out_in["experts_up"], OutIn) and isinstance(out_in["shared_up"], OutIn)
    y_dense, idx_dense, _ = moe_layer(layer_params, x, TINY, backend=MoeBackend.DENSE)
    y, idx, _ = jax.jit(lambda p, x: moe_layer(p, x, cfg))(out_in, x)
    np.testing.assert_array_equal(idx, idx_dense)
    np.testing.assert_allclose(y, y_dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["out_in", "packed"])
def test_engine_layouts_fuse_gate_and_up_once(packed, request):
    """Qwen3-MoE's SwiGLU experts: the gate and up weights fused once ([E, w, 2f]) in both CPU
    layouts, the output equal to the dense dispatch."""
    if packed:
        request.getfixturevalue("cpu_kernel")
    lp = _moe_layer_params(QWEN, 1, "0_moe")
    x = jax.random.normal(jax.random.key(2), (2, 6, QWEN.hidden_size))
    cfg = QWEN.replace(moe_backend=MoeBackend.GROUPED, pattern="E")
    params = {"blocks": [{"0_moe": jax.tree.map(lambda a: a[None], lp)}]}
    layer = jax.tree.map(lambda a: a[0], out_in_params(cfg, params, packed=packed)["blocks"][0][
        "0_moe"])
    assert "experts_gate" not in layer and "experts_up" not in layer
    assert isinstance(layer["experts_gate_up"], Packed if packed else OutIn)
    y_ref, idx_ref, _ = moe_layer(lp, x, QWEN, backend=MoeBackend.DENSE)
    y, idx, _ = jax.jit(lambda p, x: moe_layer(p, x, cfg))(layer, x)
    np.testing.assert_array_equal(idx, idx_ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)


def test_out_in_experts_refuse_other_dispatches():
    """The layout holds the experts for the grouped loop only: another dispatch is refused with
    one line naming it."""
    lp = _moe_layer_params(TINY, 0, "1_moe")
    cfg = TINY.replace(moe_backend=MoeBackend.GROUPED, pattern="E")
    params = {"blocks": [{"0_moe": jax.tree.map(lambda a: a[None], lp)}]}
    layer = jax.tree.map(lambda a: a[0], out_in_params(cfg, params)["blocks"][0]["0_moe"])
    x = jax.random.normal(jax.random.key(2), (1, 2, TINY.hidden_size))
    with pytest.raises(ValueError, match="grouped only, not backend='dense'"):
        moe_layer(layer, x, cfg, backend=MoeBackend.DENSE)
