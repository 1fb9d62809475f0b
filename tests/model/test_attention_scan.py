"""CAUSAL_SCAN attention (a scan over the block pairs at or below the diagonal, FlashAttention
backward) equals the naive reference that materialises every score: values and gradients,
packed segments and a ragged last block; and the same under the sequence-parallel rules on
an fsdp 2 x expert 4 mesh (heads split, whole rows per chip)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.model import AttentionImpl, presets
from avalon.model.attention import attention
from avalon.model.attention_scan import causal_scan_attention
from avalon.model.params import init_params
from avalon.sharding import TRAIN_SEQ_RULES, make_mesh, use_rules
from experiments.scale import hlo_stats
from tests.model.attention_reference import SCALE, _naive, packed_inputs


@pytest.fixture(scope="module")
def inputs():
    return packed_inputs()


@pytest.mark.parametrize("block", [4, 8, 64])
def test_causal_scan_equals_naive_values_and_gradients(inputs, block):
    q, k, v, seg, probe = inputs
    scan = lambda q, k, v: causal_scan_attention(q, k, v, seg, SCALE, block)  # noqa: E731
    naive = lambda q, k, v: _naive(q, k, v, seg)  # noqa: E731
    np.testing.assert_allclose(jax.jit(scan)(q, k, v), naive(q, k, v), atol=2e-6, rtol=1e-5)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a) * probe)  # noqa: E731
    g_scan = jax.jit(jax.grad(loss(scan), argnums=(0, 1, 2)))(q, k, v)
    g_naive = jax.grad(loss(naive), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_scan, g_naive):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def _collectives_in_loops(hlo_text: str) -> list[str]:
    """The collectives of a compiled module that sit inside a `while` body (at any depth)."""
    comps, entry = hlo_stats.parse_module(hlo_text)
    found, seen = [], set()

    def visit(name: str, in_loop: bool):
        if (name, in_loop) in seen or name not in comps:
            return
        seen.add((name, in_loop))
        for ins in comps[name].instrs:
            base = ins.opcode.removesuffix("-start")
            if in_loop and base in hlo_stats.COLLECTIVES:
                found.append(f"{ins.opcode} {ins.shape}")
            for key in ("body", "condition", "calls", "to_apply"):
                callee = re.search(rf"\b{key}=%?([\w.\-]+)", ins.attrs)
                if callee:
                    visit(callee.group(1), in_loop or ins.opcode == "while")

    visit(entry, False)
    return found


# (query heads, kv heads) over the 4 chips of a row: a chip's heads inside one kv group
# (tiny: 1 of 2 per group; Super's 32 / 2: 8 of 16), or whole groups (16 / 8: 2 groups each).
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (32, 2), (16, 8)])
def test_causal_scan_layer_under_sequence_parallel_mesh_equals_naive(heads, kv_heads):
    """The attention layer (projections included), its input split over positions on an
    fsdp 2 x expert 4 mesh under TRAIN_SEQ_RULES, against the naive layer on one device; and
    its block scans hold no collective (each chip runs its heads of whole rows on its own)."""
    cfg = presets.get("tiny", pattern="*", attention_query_chunk=8, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=8)
    lp = init_params(jax.random.key(1), cfg)["blocks"][0]["0_attention"]
    lp = jax.tree.map(lambda a: a[0], lp)
    b, t = 2, 48
    x = jax.random.normal(jax.random.key(2), (b, t, cfg.hidden_size))
    seg = jnp.concatenate([jnp.full((b, 20), 1), jnp.full((b, 28), 2)], 1).astype(jnp.int32)
    probe = jax.random.normal(jax.random.key(3), (b, t, cfg.hidden_size))

    def loss(impl, lp, x):
        y, _ = attention(lp, x, cfg.replace(attention_impl=impl), segment_ids=seg)
        return jnp.sum(y * probe)

    mesh = make_mesh({"fsdp": 2, "expert": 4})

    def sharded(lp, x):
        with use_rules(mesh, TRAIN_SEQ_RULES):
            return jax.value_and_grad(loss, argnums=(1, 2))(AttentionImpl.CAUSAL_SCAN, lp, x)

    x_sh = jax.device_put(x, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("fsdp", "expert")))
    compiled = jax.jit(sharded).lower(lp, x_sh).compile()
    assert _collectives_in_loops(compiled.as_text()) == []
    val, (g_lp, g_x) = compiled(lp, x_sh)
    ref, (r_lp, r_x) = jax.value_and_grad(loss, argnums=(1, 2))(AttentionImpl.NAIVE, lp, x)
    np.testing.assert_allclose(val, ref, rtol=1e-5)
    np.testing.assert_allclose(g_x, r_x, atol=1e-5, rtol=1e-5)
    for key in r_lp:
        np.testing.assert_allclose(g_lp[key], r_lp[key], atol=1e-5, rtol=1e-5, err_msg=key)
