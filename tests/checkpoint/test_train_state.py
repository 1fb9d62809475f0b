"""TrainCheckpointer: restore onto a different mesh, retention, host state, PRNG keys, a save
killed half-way leaving the previous checkpoint restorable, and corruption (a flipped bit,
corrupt JSON, a missing file) detected, named and skipped on resume."""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from avalon.checkpoint.content_sums import content_sums
from avalon.checkpoint.train_state import CheckpointCorruptError, TrainCheckpointer
from avalon.model import abstract_params, param_shardings, presets
from avalon.sharding import make_mesh

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
    import os, sys, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    from orbax.checkpoint._src.path import atomicity
    from avalon.checkpoint.train_state import TrainCheckpointer

    commit = atomicity.AtomicRenameTemporaryPath.finalize
    async def held_commit(self):  # step 2's data is written; hold it just before the rename
        if self._final_path.name == "2":
            print("WRITTEN", self.get().name, flush=True)
            time.sleep(600)
        return await commit(self)
    atomicity.AtomicRenameTemporaryPath.finalize = held_commit

    ckpt = TrainCheckpointer(sys.argv[1])
    ckpt.save(1, {"w": jax.numpy.asarray(np.arange(1000, dtype=np.float32))}, {"step": 1})
    ckpt.wait()
    big = {f"w{i}": jax.device_put(np.full((4 << 20,), i, np.float32)) for i in range(4)}
    ckpt.save(2, big, {"step": 2})
    ckpt.wait()
    print("DONE", flush=True)
""")


def test_killed_save_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL a process whose save of step 2 (64 MB) has written every byte but not yet been
    committed (the child holds orbax's final rename, so the kill is provably mid-save, not a
    race with a fast disk); step 1 must still restore, step 2 must not be listed, and the next
    save of step 2 must work."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 300)
        assert ready, "the child printed nothing in 300 s"
        line = child.stdout.readline().split()
        assert line[:1] == ["WRITTEN"], f"the child ended before holding the commit: {line}"
        listed = set(os.listdir(tmp_path))
        assert line[1] in listed and "2" not in listed, listed
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with TrainCheckpointer(tmp_path) as ckpt:
        assert ckpt.all_steps() == [1]
        state, host = ckpt.restore()
        assert host == {"step": 1}
        np.testing.assert_array_equal(state["w"], np.arange(1000, dtype=np.float32))
        assert ckpt.save(2, {"w": jnp.ones(3)}, {"step": 2})
        ckpt.wait()
        assert ckpt.all_steps() == [1, 2]
    assert not any("tmp" in name for name in os.listdir(tmp_path))


# ----- integrity -----

def _small(seed: int) -> dict:
    """Random floats (incompressible: a flipped stored bit is a flipped value) and a key."""
    w = np.random.default_rng(seed).standard_normal(1 << 16).astype(np.float32)
    return {"w": jnp.asarray(w), "k": jax.random.key(seed)}


def _data_file(step_dir) -> str:
    """The largest file of the step's array data (the one holding `w`)."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state"))
             for f in fs]
    return max(files, key=os.path.getsize)


def _flip_bit(path: str, bit: int = 4) -> None:
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 1 << bit
    Path(path).write_bytes(bytes(data))


def _mix(z: int) -> int:
    """SplitMix64's finaliser, in Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def _reference_sums(x: np.ndarray) -> str:
    """The definition of content_sums.py, word by word in Python integers."""
    x = np.ascontiguousarray(x)
    width = x.dtype.itemsize if x.dtype.itemsize in (1, 2, 4, 8) else 8
    words = [int(w) for w in x.reshape(-1).view(f"<u{width}")]
    s0 = sum(words) % 2**64
    h = sum(_mix(w ^ (i * 0x9E3779B97F4A7C15 % 2**64)) for i, w in enumerate(words)) % 2**64
    return f"{s0:016x}:{h:016x}"


def test_content_sums_match_the_reference_on_any_sharding_and_catch_every_bit():
    rng = np.random.default_rng(0)
    mesh = make_mesh({"data": 2, "tensor": 4})
    P = jax.sharding.PartitionSpec
    arrays = [rng.standard_normal((8, 16, 6)).astype(np.float32),
              rng.standard_normal((16, 8)).astype(jnp.bfloat16),
              rng.integers(-128, 127, (8, 8), dtype=np.int8),
              (rng.standard_normal((8, 8)) + 1j).astype(np.complex64),
              rng.standard_normal(()).astype(np.float32)]
    wide = (rng.standard_normal((4, 3)) + 1j).astype(np.complex128)  # two words an element
    assert content_sums([wide]) == [_reference_sums(wide)]  # (host only: JAX would narrow it)
    for x in arrays:
        want = _reference_sums(x)
        assert content_sums([x]) == [want], x.dtype
        specs = [P()] if x.ndim == 0 else [P(), P("data"), P("tensor"), P(("data", "tensor"))]
        if x.ndim >= 2:
            specs += [P(None, "tensor"), P("tensor", "data"), P(None, ("data", "tensor"))]
        for spec in specs:
            placed = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
            assert content_sums([placed]) == [want], (x.dtype, spec)
    long = rng.standard_normal(3 << 20).astype(np.float32)  # rows over one numpy chunk
    placed = jax.device_put(long, jax.sharding.NamedSharding(mesh, P("data")))
    assert content_sums([long]) == content_sums([placed])
    assert content_sums([long[:1000]]) == [_reference_sums(long[:1000])]
    x = arrays[0]
    want = content_sums([x])
    for bit in range(32):  # every bit of one element
        y = x.copy()
        y.view(np.uint32)[5, 13, 2] ^= np.uint32(1 << bit)
        assert content_sums([y]) != want, bit
    swapped = x.copy()
    swapped[0, 0, [0, 1]] = swapped[0, 0, [1, 0]]  # same words, other places: H sees it
    assert content_sums([swapped]) != want
    # Changes that cancel in any sum weighted by a polynomial of the index of degree < 2 (the
    # second difference +k, -2k, +k), and two top-bit flips of 8-byte words (+2**63 twice).
    words = np.arange(64, dtype=np.uint32) * 1000 + 5000
    bent = words.copy()
    bent[10:13] += np.array([7, -14, 7], np.int64).astype(np.uint32)
    assert content_sums([bent]) != content_sums([words])
    big = np.arange(8, dtype=np.uint64)
    flipped = big ^ np.array([1 << 63, 0, 1 << 63, 0, 0, 0, 0, 0], np.uint64)
    assert content_sums([flipped]) != content_sums([big])


def test_a_flipped_bit_in_array_data_is_detected_and_named(tmp_path):
    """The old checkpointer restored this with one wrong value and no error."""
    state = _small(0)
    with TrainCheckpointer(tmp_path) as ckpt:
        ckpt.save(1, state, {"step": 1})
        ckpt.wait()
    _flip_bit(_data_file(tmp_path / "1"))
    with TrainCheckpointer(tmp_path) as ckpt:
        with pytest.raises(CheckpointCorruptError,
                           match=f"^{tmp_path}/1/state: array 'w' does not match its saved"):
            ckpt.restore()


def test_corrupt_newest_steps_are_skipped_and_can_be_written_again(tmp_path):
    with TrainCheckpointer(tmp_path, max_to_keep=None) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, _small(step), {"step": step})
        ckpt.wait()
    _flip_bit(_data_file(tmp_path / "3"))
    (tmp_path / "2" / "host" / "metadata").write_text('{"step": ')  # torn JSON
    with TrainCheckpointer(tmp_path, max_to_keep=None) as ckpt:
        got = ckpt.restore_newest_intact()
        assert got.step == 1 and got.host_state == {"step": 1}
        np.testing.assert_array_equal(got.state["w"], _small(1)["w"])
        assert [s for s, _ in got.skipped] == [3, 2]
        assert "3/state: array 'w'" in got.skipped[0][1]
        assert got.skipped[1][1].startswith(f"{tmp_path}/2/host/metadata: cannot be read")
        for step, _ in got.skipped:
            assert ckpt.quarantine(step).name == f"{step}.corrupt"
        assert ckpt.all_steps() == [1]
        assert ckpt.save(2, _small(5), {"step": 2})  # the step is written again
        ckpt.wait()
        assert ckpt.restore_newest_intact().step == 2
    assert sorted(os.listdir(tmp_path)) >= ["1", "2", "2.corrupt", "3.corrupt"]


def test_every_error_names_its_file(tmp_path):
    with TrainCheckpointer(tmp_path, max_to_keep=None) as ckpt:
        for step in (1, 2, 3, 4):
            ckpt.save(step, _small(step), {"step": step})
        ckpt.wait()
    (tmp_path / "1" / "meta" / "metadata").write_text("{not json")
    os.remove(_data_file(tmp_path / "2"))
    host = json.loads((tmp_path / "3" / "host" / "metadata").read_text())
    (tmp_path / "3" / "host" / "metadata").write_text(json.dumps({**host, "step": 30}))
    with TrainCheckpointer(tmp_path, max_to_keep=None) as ckpt:
        cases = {1: f"^{tmp_path}/1/meta/metadata: cannot be read",
                 2: f"^{tmp_path}/2/state: cannot be read",
                 3: f"^{tmp_path}/3/host/metadata: sha256 differs"}
        for step, match in cases.items():
            with pytest.raises(CheckpointCorruptError, match=match):
                ckpt.restore(step)
        wrong = {"w": jax.ShapeDtypeStruct((7,), jnp.float32),
                 "k": jax.eval_shape(lambda: jax.random.key(0))}
        with pytest.raises(ValueError, match="4/meta/metadata: the restore target does not "
                           "match the saved state at 'w'") as e:
            ckpt.restore(4, target=wrong)
        assert not isinstance(e.value, CheckpointCorruptError)  # a config change: no fallback
        ckpt.quarantine(4)
        with pytest.raises(CheckpointCorruptError, match="no intact checkpoint: step 3: .*"
                           "; step 2: .*; step 1: .*1/meta/metadata"):
            ckpt.restore_newest_intact()
