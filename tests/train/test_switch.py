"""The trainer-to-engine switch: the engine reads the training params, re-laid out only when
the training layout splits weights along `embed` (fsdp)."""

import jax
import numpy as np
import pytest

from avalon import sharding
from avalon.model import init_params, presets
from avalon.train.setup import engine_params, make_local_mesh

CFG = presets.get("tiny")


@pytest.fixture(scope="module")
def host_params():
    return init_params(jax.random.key(0), CFG)


def test_same_layout_is_the_same_arrays(host_params):
    mesh = sharding.make_mesh({"data": 2, "tensor": 4})
    params = jax.device_put(host_params, sharding.param_shardings(CFG, mesh))
    out = engine_params(params, CFG, mesh, make_local_mesh(mesh))
    assert all(a is b for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(params)))


def test_fsdp_training_layout_is_relaid_for_decoding(host_params):
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    params = jax.device_put(host_params, sharding.param_shardings(CFG, mesh))
    local = make_local_mesh(mesh)
    out = engine_params(params, CFG, mesh, local)
    want = sharding.param_shardings(CFG, local, sharding.DECODE_RULES)
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
