"""The expert-parallel MoE (shard_map + all-to-all over `expert`) equals the dense reference.

On a 2 x 4 CPU mesh (fsdp 2 x expert 4: 8 experts, 2 per chip; tokens over all 8 devices):
values and gradients (params and input) match the single-device dense dispatch, and the
compiled program gathers no token-sized array (only weights are all-gathered). With a capacity
bound: at the worst case it is still the dense layer; below it, the dropped choices are the
hand-computed ones and the layer is the dense one without their expert contributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from avalon import sharding
from avalon.backends import platform as backend_platform
from avalon.backends.tpu_megablox import megablox_gmm, megablox_row_tile
from avalon.model import init_params, presets
from avalon.model.config import MoeBackend, Remat
from avalon.model.moe import _experts_dense, moe_layer, route
from avalon.model.moe_ep import _grouped, capacity
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


WEIGHTS = ("experts_up", "experts_down", "latent_in", "latent_out", "shared_up")


def _assert_same(y, loss, g, ref_y, ref_loss, ref_g, names):
    """Outputs, loss, the named parameter gradients and the input gradient equal the reference."""
    np.testing.assert_allclose(y, ref_y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    for name in names:
        np.testing.assert_allclose(g[0][name], ref_g[0][name], rtol=2e-4, atol=2e-5,
                                   err_msg=name)
    np.testing.assert_allclose(g[1], ref_g[1], rtol=2e-4, atol=2e-5)


def _loss(p, x, backend, cfg=CFG):
    y, _, _ = moe_layer(p, x, cfg, backend=backend)
    return jnp.sum(jnp.sin(y) * y), y


# Remat: each chip's 2 dispatch chunks are recomputed in the backward (`remat_chunks`).
@pytest.mark.parametrize("local,remat", [(MoeBackend.DENSE, Remat.NONE),
                                         (MoeBackend.RAGGED_DOT, Remat.NONE),
                                         (MoeBackend.DENSE, Remat.FULL)])
def test_expert_parallel_equals_dense(setup, local, remat):
    lp, x, mesh = setup
    (ref_loss, ref_y), ref_g = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(
        lp, x, MoeBackend.DENSE)
    cfg = CFG.replace(remat=remat)

    def sharded(p, x):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(p, x, local, cfg)

    p_sh = {k: NamedSharding(mesh, sharding.logical_to_spec(
        spec.axes, sharding.TRAIN_RULES, mesh, spec.shape)) for k, spec in moe_specs(CFG).items()}
    x_sh = NamedSharding(mesh, PartitionSpec(("fsdp", "expert")))
    fn = jax.jit(sharded, in_shardings=(p_sh, x_sh))
    (loss, y), g = fn(lp, x)
    _assert_same(y, loss, g, ref_y, ref_loss, ref_g, WEIGHTS + ("router",))

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
    resolve = backend_platform.resolve_moe_backend
    assert resolve(MoeBackend.AUTO, "tpu") == MoeBackend.MEGABLOX
    assert resolve(MoeBackend.AUTO, "cpu") == MoeBackend.GROUPED
    assert resolve(MoeBackend.AUTO, "gpu") == MoeBackend.CAPACITY_BUCKETS
    with pytest.raises(ValueError, match="ragged_dot.*gpu"):
        resolve(MoeBackend.RAGGED_DOT, "gpu")
    with pytest.raises(ValueError, match="megablox.*cpu"):
        resolve(MoeBackend.MEGABLOX, "cpu")
    assert presets.get("toy").moe_backend == MoeBackend.AUTO
    toy = presets.get("toy")
    assert backend_platform.model_ops("tpu", toy).moe_backend == MoeBackend.MEGABLOX
    assert backend_platform.model_ops("tpu", toy).grouped_matmul is megablox_gmm
    assert backend_platform.model_ops("cpu", toy).moe_backend == MoeBackend.GROUPED


def test_megablox_without_its_kernel_is_a_clear_error():
    xs, w = jnp.ones((4, 8)), jnp.ones((2, 8, 8))
    with pytest.raises(ValueError, match="megablox.*no grouped matmul was given"):
        _grouped(xs, jnp.array([2, 2]), w, MoeBackend.MEGABLOX)


def _sharded_fn(mesh, cfg, backend, routing=None):
    """jit of (loss, y, dropped) and their gradients under the training rules on `mesh`."""
    def loss(p, x):
        y, _, dropped = moe_layer(p, x, cfg, routing=routing, backend=backend)
        return jnp.sum(jnp.sin(y) * y), (y, dropped)

    def sharded(p, x):
        with sharding.use_rules(mesh, sharding.TRAIN_RULES):
            return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(p, x)

    p_sh = {k: NamedSharding(mesh, sharding.logical_to_spec(
        spec.axes, sharding.TRAIN_RULES, mesh, spec.shape)) for k, spec in moe_specs(cfg).items()}
    x_sh = NamedSharding(mesh, PartitionSpec(("fsdp", "expert")))
    return jax.jit(sharded, in_shardings=(p_sh, x_sh))


def test_capacity_at_the_worst_case_equals_dense(setup):
    """Capacity factor ep (= 4: C = chunk x k, the dropless worst case) under an adversarial
    routing (every token on the experts of one chip): nothing dropped, dense values and
    gradients."""
    lp, x, mesh = setup
    cfg = CFG.replace(moe_capacity_factor=4.0)
    n = x.shape[0] * x.shape[1]
    routing = jnp.tile(jnp.array([[0, 1]], jnp.int32), (n, 1)).reshape(*x.shape[:2], 2)
    (ref_loss, ref_y), ref_g = jax.value_and_grad(_loss_routed, argnums=(0, 1), has_aux=True)(
        lp, x, routing)
    (loss, (y, dropped)), g = _sharded_fn(mesh, cfg, MoeBackend.DENSE, routing)(lp, x)
    assert int(dropped) == 0
    _assert_same(y, loss, g, ref_y, ref_loss, ref_g, WEIGHTS)


def _loss_routed(p, x, routing):
    y, _, _ = moe_layer(p, x, CFG, routing=routing, backend=MoeBackend.DENSE)
    return jnp.sum(jnp.sin(y) * y), y


# A hand-built routing, the same for every chunk of 6 tokens (each chip routes 12 tokens as 2
# chunks; 2 experts per chip on the expert axis of 4, so destination = expert // 2):
_PATTERN = [(0, 2), (0, 3), (1, 2), (1, 4), (0, 6), (1, 7)]
# Per chunk, destination 0 receives the first choice of all 6 tokens, destination 1 the second
# of tokens 0-2, destination 2 that of token 3, destination 3 those of tokens 4 and 5. Capacity
# factor 1: C = ceil(1 x 6 x 2 / 4) = 3 rows per destination, so destination 0 keeps tokens
# 0-2 and drops the first choice of tokens 3, 4, 5 (token order); nothing else overflows.
_DROPPED_SLOT0 = (3, 4, 5)  # positions within a chunk whose choice 0 is dropped


def test_small_capacity_drops_the_hand_computed_choices(setup):
    lp, x, mesh = setup
    cfg = CFG.replace(moe_capacity_factor=1.0)
    n = x.shape[0] * x.shape[1]
    routing = jnp.tile(jnp.array(_PATTERN, jnp.int32), (n // 6, 1)).reshape(*x.shape[:2], 2)
    drop = np.zeros((n, 2), bool)
    for pos in _DROPPED_SLOT0:
        drop[pos::6, 0] = True
    assert drop.sum() == 48  # 16 chunks x 3

    def reference(p, x):
        """The dense layer minus the dropped choices' expert contributions."""
        y_full, _, _ = moe_layer(p, x, CFG, routing=routing, backend=MoeBackend.DENSE)
        x2 = x.reshape(n, -1)
        idx, weights = route(p, x2, CFG, routing.reshape(n, 2))
        per_choice = _experts_dense(x2 @ p["latent_in"], idx, p["experts_up"],
                                    p["experts_down"])
        lost = jnp.einsum("nkw,nk->nw", per_choice, jnp.where(drop, weights, 0.0))
        y = y_full - (lost @ p["latent_out"]).reshape(x.shape)
        return jnp.sum(jnp.sin(y) * y), y

    (ref_loss, ref_y), ref_g = jax.value_and_grad(reference, argnums=(0, 1), has_aux=True)(
        lp, x)
    (loss, (y, dropped)), g = _sharded_fn(mesh, cfg, MoeBackend.DENSE, routing)(lp, x)
    assert int(dropped) == 48
    # The drop is real: the output differs from the dropless layer's by far more than rounding.
    y_dropless, _, _ = moe_layer(lp, x, CFG, routing=routing, backend=MoeBackend.DENSE)
    assert np.max(np.abs(np.asarray(y) - np.asarray(y_dropless))) > 1e-2
    _assert_same(y, loss, g, ref_y, ref_loss, ref_g, WEIGHTS)


def test_capacity_rows():
    assert capacity(6, 2, 4, None) == 12  # dropless: the whole chunk's choices
    assert capacity(6, 2, 4, 1.0) == 3
    assert capacity(6, 2, 4, 1.25) == 4  # ceil(3.75)
    assert capacity(6, 2, 1, 1.25) == 12  # one destination: never more than n k
    assert capacity(4096, 22, 4, 1.25) == 28160  # the pod: 1.25 x 22,528
    # Rounded up to whole megablox row tiles: the pod at 1.1 (24,781 -> 24,832 rows).
    assert capacity(4096, 22, 4, 1.1) == 24781
    assert capacity(4096, 22, 4, 1.1, 128) == 24832
    assert capacity(6, 2, 4, 1.0, 128) == 12  # never past the worst case n k


def test_megablox_row_tile():
    # The pod: 4 x 24,832 rows, 128 local experts. 512 rows would add up to 127 x 512 rows.
    assert megablox_row_tile(99328, 128) == 128
    assert megablox_row_tile(4 * 4096, 8) == 512
    assert megablox_row_tile(3 * 128, 2) == 128  # 384: no larger power of two divides it


@pytest.mark.parametrize("rows", [300, 512])  # padded to whole tiles / already whole
def test_megablox_gmm_equals_dense(rows):
    """The Pallas kernel (in Pallas' interpreter on CPU) with our tiling and row padding:
    values and gradients of the rows inside the groups equal the dense reference's."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    xs = jax.random.normal(k1, (rows, 128), jnp.float32)
    w = 0.1 * jax.random.normal(k2, (4, 128, 256), jnp.float32)
    counts = jnp.array([70, 0, rows // 2, 41], jnp.int32)  # an empty group; rows left over
    valid = int(jnp.sum(counts))
    probe = jax.random.normal(k3, (valid, 256), jnp.float32)

    def loss(xs, w, grouped):
        return jnp.sum(jnp.sin(grouped(xs, counts, w)[:valid]) * probe)

    ref = jax.value_and_grad(loss, argnums=(0, 1))(
        xs, w, lambda x, c, w: _grouped(x, c, w, MoeBackend.DENSE))
    got = jax.value_and_grad(loss, argnums=(0, 1))(
        xs, w, lambda x, c, w: megablox_gmm(x, w, c, interpret=True))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    # The rows past the groups are unwritten by the kernel (NaN in the interpreter), in the
    # output and in the input gradient alike; the dispatch never reads them.
    np.testing.assert_allclose(got[1][0][:valid], ref[1][0][:valid], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1][1], ref[1][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [0.5, float("inf"), True, "2"])
def test_capacity_factor_is_validated(bad):
    with pytest.raises(ValueError, match=r"ModelConfig.moe_capacity_factor=.*>= 1"):
        CFG.replace(moe_capacity_factor=bad)
