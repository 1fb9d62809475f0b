"""The trainer-to-engine switch: the engine reads the training params in `engine.decode_dtype`
(a bf16 view, or the fp32 master itself), re-laid out only when the training layout splits
weights along `embed` (fsdp)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import sharding
from avalon.model import init_params, param_shardings, presets
from avalon.train.setup import Switch, engine_params, make_local_mesh

CFG = presets.get("tiny")


@pytest.fixture(scope="module")
def host_params():
    return init_params(jax.random.key(0), CFG)


def test_same_layout_is_the_same_arrays(host_params):
    mesh = sharding.make_mesh({"data": 2, "tensor": 4})
    params = jax.device_put(host_params, param_shardings(CFG, mesh))
    out = engine_params(params, CFG, mesh, make_local_mesh(mesh))
    assert all(a is b for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(params)))


def test_fsdp_training_layout_is_relaid_for_decoding(host_params):
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    params = jax.device_put(host_params, param_shardings(CFG, mesh))
    local = make_local_mesh(mesh)
    out = engine_params(params, CFG, mesh, local)
    want = param_shardings(CFG, local, sharding.DECODE_RULES)
    for a, b, w in zip(jax.tree.leaves(out), jax.tree.leaves(host_params), jax.tree.leaves(want)):
        assert a.sharding.spec == w.spec
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The training arrays were split along embed; the engine's are whole along it.
    up = params["blocks"][0]["0_mamba"]["in_x"]
    assert "fsdp" in str(up.sharding.spec)
    assert "fsdp" not in str(out["blocks"][0]["0_mamba"]["in_x"].sharding.spec)


def test_local_mesh_keeps_model_positions():
    mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
    local = make_local_mesh(mesh)
    assert local.shape["expert"] == 2 and local.shape["tensor"] == 2
    assert local.shape["data"] * local.shape["fsdp"] == 2
    np.testing.assert_array_equal(local.devices.reshape(-1, 2, 2), mesh.devices.reshape(-1, 2, 2))


def _train_config(decode_dtype: str):
    from avalon.train.config import from_config_dict
    from tests.train import micro_config
    c = micro_config.get_config()
    c.engine.decode_dtype = decode_dtype
    return from_config_dict(c, num_devices=1)  # its sections; the model and mesh are the test's


def test_bf16_switch_casts_matrices_and_relays_them(host_params):
    """Cast on the training layout, then re-laid out for decoding: bf16 matrices (the master's
    values rounded), fp32 vectors, decode shardings; the cost is in `metrics`."""
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    params = jax.device_put(host_params, param_shardings(CFG, mesh))
    local = make_local_mesh(mesh)
    cfg = dataclasses.replace(_train_config("bfloat16"), model=CFG)
    switch = Switch(cfg, mesh, local)
    out = switch(params)
    want = param_shardings(CFG, local, sharding.DECODE_RULES)
    for a, b, w in zip(jax.tree.leaves(out), jax.tree.leaves(host_params), jax.tree.leaves(want)):
        assert a.dtype == (jnp.bfloat16 if b.ndim >= 2 else jnp.float32)
        assert a.sharding.spec == w.spec
        np.testing.assert_array_equal(np.asarray(a, np.float32),
                                      np.asarray(b.astype(a.dtype), np.float32))
    assert switch.metrics["switch/bytes"] == sum(x.nbytes for x in jax.tree.leaves(out))
    assert 0 < switch.metrics["time/switch_cast_s"] <= switch.metrics["time/switch_view_s"]


def test_fp32_switch_on_the_same_layout_is_the_master_itself(host_params):
    mesh = sharding.make_mesh({"data": 2, "tensor": 4})
    params = jax.device_put(host_params, param_shardings(CFG, mesh))
    cfg = dataclasses.replace(_train_config("float32"), model=CFG)
    switch = Switch(cfg, mesh, make_local_mesh(mesh))
    out = switch(params)
    assert all(a is b for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(params)))
    assert switch.metrics["switch/bytes"] == 0


@pytest.mark.parametrize("decode_dtype", ["bfloat16", "float32"])
def test_the_runs_engine_decodes_with_the_configured_dtype(tmp_path, decode_dtype):
    """The RL run's engine (built once, re-pointed after every update) reads weight matrices
    in `engine.decode_dtype` from a master that stays fp32; the switch's cost is logged."""
    from avalon.train import loop
    from tests.train import micro_config
    c = micro_config.get_config()
    c.engine.decode_dtype = decode_dtype
    c.mesh.fsdp, c.mesh.tensor = 2, 4  # the 8 test devices; fsdp: the re-laid-out path
    run = loop.prepare(c, str(tmp_path))
    want = jnp.dtype(decode_dtype)

    def matrices(tree):
        return {a.dtype for a in jax.tree.leaves(tree) if a.ndim >= 2}

    run.engine = run.make_engine()
    assert matrices(run.state.params) == {jnp.dtype(jnp.float32)}
    assert matrices(run.engine._run_params) == {want}  # what the device programs read
    run.state = run.state.replace(params=jax.tree.map(lambda a: a + 1, run.state.params))
    m = run.switch_engine()
    assert matrices(run.engine._run_params) == {want}
    embed = run.engine._params["embed"]
    np.testing.assert_array_equal(np.asarray(embed, np.float32),
                                  np.asarray(run.state.params["embed"].astype(want), np.float32))
    assert (m["switch/bytes"] > 0) == (decode_dtype == "bfloat16")
    assert m["time/switch_s"] >= m["time/switch_view_s"] > 0
