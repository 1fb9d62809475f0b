"""The expert-parallel MoE (shard_map + all-to-all over `expert`) equals the dense reference.

On a 2 x 4 CPU mesh (fsdp 2 x expert 4: 8 experts, 2 per chip; tokens over all 8 devices):
values and gradients (params and input) match the single-device dense dispatch, and the
compiled program gathers no token-sized array (only weights are all-gathered)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from avalon import sharding
from avalon.model import init_params, presets
from avalon.model.config import MoeBackend
from avalon.model.moe import moe_layer, resolve_backend
from avalon.model.params import moe_specs
from experiments.scale import hlo_stats

CFG = presets.get("tiny", moe_dispatch_chunk=6)  # 8 experts top-2, latent 24; 2 chunks/chip


@pytest.fixture(scope="module")
def setup():
    params = init_params(jax.random.key(0), CFG)
    lp = jax.tree.map(lambda a: a[0], params["blocks"][0]["1_moe"])
    lp = {**lp, "router": lp["router"] * 20, "experts_up": lp["experts_up"] * 10,
          "experts_down": lp["experts_down"] * 10}
    x = jax.random.normal(jax.random.key(2), (16, 6, CFG.hidden_size))  # 96 tokens, 12 per chip
    mesh = sharding.make_mesh({"fsdp": 2, "expert": 4})
    return lp, x, mesh


def _loss(p, x, backend):
    y, _ = moe_layer(p, x, CFG, backend=backend)
    return jnp.sum(jnp.sin(y) * y), y


@pytest.mark.parametrize("local", [MoeBackend.DENSE, MoeBackend.RAGGED_DOT])
def test_expert_parallel_equals_dense(setup, local):
    lp, x, mesh = setup
    (ref_loss, ref_y), ref_g = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(
        lp, x, MoeBackend.DENSE)

    def sharded(p, x):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(p, x, local)

    p_sh = {k: NamedSharding(mesh, sharding.logical_to_spec(
        spec.axes, sharding.TRAIN_RULES, mesh, spec.shape)) for k, spec in moe_specs(CFG).items()}
    x_sh = NamedSharding(mesh, PartitionSpec(("fsdp", "expert")))
    fn = jax.jit(sharded, in_shardings=(p_sh, x_sh))
    (loss, y), g = fn(lp, x)
    np.testing.assert_allclose(y, ref_y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    for name in ("experts_up", "experts_down", "latent_in", "latent_out", "shared_up",
                 "router"):
        np.testing.assert_allclose(g[0][name], ref_g[0][name], rtol=2e-4, atol=2e-5,
                                   err_msg=name)
    np.testing.assert_allclose(g[1], ref_g[1], rtol=2e-4, atol=2e-5)

    # Only weights are all-gathered: no all-gather result holds a row per token.
    text = fn.lower(lp, x).compile().as_text()
    comps, _ = hlo_stats.parse_module(text)
    kinds = hlo_stats.analyse(text).collectives
    assert "all-to-all" in kinds
    n_tokens = x.shape[0] * x.shape[1]
    for comp in comps.values():
        for ins in comp.instrs:
            if ins.opcode.startswith("all-gather"):
                for _, dims in hlo_stats.array_dims(ins.shape):
                    assert n_tokens not in dims and x.shape[0] not in dims, ins.shape


def test_backend_per_platform():
    assert resolve_backend(MoeBackend.AUTO, "tpu") == MoeBackend.MEGABLOX
    assert resolve_backend(MoeBackend.AUTO, "cpu") == MoeBackend.CAPACITY_BUCKETS
    assert resolve_backend(MoeBackend.AUTO, "gpu") == MoeBackend.CAPACITY_BUCKETS
    with pytest.raises(ValueError, match="ragged_dot.*gpu"):
        resolve_backend(MoeBackend.RAGGED_DOT, "gpu")
    with pytest.raises(ValueError, match="megablox.*cpu"):
        resolve_backend(MoeBackend.MEGABLOX, "cpu")
    assert presets.get("toy").moe_backend == MoeBackend.AUTO
