"""TrainCheckpointer: restore onto a different mesh, retention, host state, PRNG keys, and a
save killed half-way leaving the previous checkpoint restorable."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.model import abstract_params, presets
from avalon.sharding import make_mesh, param_shardings

CFG = presets.get("tiny")


def _placement(mesh):
    """(param shardings, opt-state sharding by leaf shape, replicated) for `mesh`. AdamW's mu and
    nu are shaped like the params and shard like them; the step count is replicated."""
    abstract = abstract_params(CFG)
    shardings = param_shardings(CFG, mesh)
    by_shape = {a.shape: s for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))}
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return shardings, lambda a: by_shape.get(a.shape, replicated), replicated


def _state_on(mesh, seed=0):
    """A training state like the driver's (params, optax AdamW state, step, PRNG key), every
    leaf random and placed per the mesh's shardings (built on the host: no compiles)."""
    rng = np.random.default_rng(seed)
    abstract = abstract_params(CFG)
    shardings, opt_sharding, replicated = _placement(mesh)
    put = lambda a, s: jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), s)
    params = jax.tree.map(put, abstract, shardings)
    opt_state = jax.tree.map(lambda a: put(a, opt_sharding(a)),
                             jax.eval_shape(optax.adamw(1e-3).init, abstract))
    return {"params": params, "opt_state": opt_state,
            "step": jax.device_put(np.int32(123), replicated),
            "rng": jax.device_put(jax.random.key(seed), replicated)}


def _target_on(mesh):
    """The restore target for `mesh`: ShapeDtypeStructs carrying the new shardings."""
    abstract = abstract_params(CFG)
    shardings, opt_sharding, replicated = _placement(mesh)
    sds = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    opt = jax.tree.map(lambda a: sds(a, opt_sharding(a)),
                       jax.eval_shape(optax.adamw(1e-3).init, abstract))
    return {"params": jax.tree.map(sds, abstract, shardings), "opt_state": opt,
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
            "rng": sds(jax.eval_shape(lambda: jax.random.key(0)), replicated)}


def _host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.random.key_data(x))
                        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else np.asarray(x), tree)


def test_save_on_2x4_restore_on_1x2(tmp_path):
    big = make_mesh({"data": 2, "tensor": 4})
    state = _state_on(big)
    assert {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(state)} == {8}
    host = {"sampler": {"cursor": 17, "seed": 3}, "curriculum": {"level": [1, 2]}}
    with TrainCheckpointer(tmp_path) as ckpt:
        assert ckpt.save(10, state, host)
        ckpt.wait()
    small = make_mesh({"data": 1, "tensor": 2}, devices=jax.devices()[:2])
    target = _target_on(small)
    with TrainCheckpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 10
        got, got_host = ckpt.restore(target=target)
    assert got_host == host
    assert jax.tree.structure(got) == jax.tree.structure(state)  # optax namedtuples intact
    assert jnp.issubdtype(got["rng"].dtype, jax.dtypes.prng_key)
    for (path, a), b in zip(jax.tree.leaves_with_path(_host(state)), jax.tree.leaves(_host(got))):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    for leaf, want in zip(jax.tree.leaves(got), jax.tree.leaves(target)):
        assert leaf.sharding == want.sharding
    # The restored key draws exactly what the saved one would.
    np.testing.assert_array_equal(jax.random.normal(got["rng"], (3,)),
                                  jax.random.normal(state["rng"], (3,)))


def test_retention_and_latest(tmp_path):
    small = {"w": jnp.arange(6.0), "k": jax.random.key(1)}
    with TrainCheckpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in (1, 2, 3, 4):
            assert ckpt.save(step, jax.tree.map(lambda x: x, small), {"step": step})
        assert not ckpt.save(4, small)  # an existing step is not written twice
        ckpt.wait()
        assert ckpt.all_steps() == [3, 4] and ckpt.latest_step() == 4
        state, host = ckpt.restore(3)
    assert host == {"step": 3}
    np.testing.assert_array_equal(state["w"], small["w"])
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 1"):
        TrainCheckpointer(tmp_path).restore(1)


def test_bad_inputs(tmp_path):
    with TrainCheckpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="host_state is not JSON-serialisable"):
            ckpt.save(1, {"w": jnp.zeros(2)}, {"bad": object()})
        with pytest.raises(ValueError, match="step=-1"):
            ckpt.save(-1, {"w": jnp.zeros(2)})
        with pytest.raises(FileNotFoundError, match="no finished checkpoint"):
            ckpt.restore()


_CHILD = textwrap.dedent("""
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    from avalon.checkpoint.train_state import TrainCheckpointer
    ckpt = TrainCheckpointer(sys.argv[1])
    ckpt.save(1, {"w": jax.numpy.asarray(np.arange(1000, dtype=np.float32))}, {"step": 1})
    ckpt.wait()
    big = {f"w{i}": jax.device_put(np.full((16 << 20,), i, np.float32)) for i in range(4)}
    print("SAVING", flush=True)
    ckpt.save(2, big, {"step": 2})
    ckpt.wait()
    print("DONE", flush=True)
""")


def test_killed_save_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL a process while it writes step 2 (256 MB); step 1 must still restore, step 2 must
    not be listed, and the next save of step 2 must work."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().strip() == "SAVING"
        before = set(os.listdir(tmp_path))
        deadline = time.monotonic() + 60
        while not (set(os.listdir(tmp_path)) - before) and time.monotonic() < deadline:
            time.sleep(0.001)
        new = set(os.listdir(tmp_path)) - before
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    assert new and "2" not in new, f"expected an unfinished save in progress, saw {new}"
    with TrainCheckpointer(tmp_path) as ckpt:
        assert ckpt.all_steps() == [1]
        state, host = ckpt.restore()
        assert host == {"step": 1}
        np.testing.assert_array_equal(state["w"], np.arange(1000, dtype=np.float32))
        assert ckpt.save(2, {"w": jnp.ones(3)}, {"step": 2})
        ckpt.wait()
        assert ckpt.all_steps() == [1, 2]
    assert not any("tmp" in name for name in os.listdir(tmp_path))
