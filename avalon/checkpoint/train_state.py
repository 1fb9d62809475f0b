"""Training checkpoints with orbax: async, atomic, retained, restorable onto another mesh.

    ckpt = TrainCheckpointer(workdir / "checkpoints", max_to_keep=3)
    ckpt.save(step, {"params": p, "opt_state": o, "step": s, "rng": key},
              host_state={"sampler": sampler.state(), "curriculum": cur.state()})
    ...                                   # keep training: the write finishes in the background
    state, host = ckpt.restore(target=abstract_state_with_new_shardings)   # latest step
    ckpt.close()                          # waits for the last save

`state` is any pytree of arrays (params, the optax state, the step counter, RNG keys). Typed
PRNG keys (`jax.random.key`) are stored as their `key_data` and rebuilt with the same impl.
`host_state` is a JSON-serialisable dict (sampler and curriculum positions, ...), checked
before the save starts.

Guarantees, all from orbax's `CheckpointManager`:
  * asynchronous: `save` returns once the arrays are copied off the devices (so the caller may
    donate them to the next step); files are written by a background thread. `wait()` blocks
    until the write is durable.
  * atomic: a step is written into a temporary directory and renamed into place only when
    complete, so a process killed mid-save leaves the previous steps restorable; leftovers
    are removed when the next `TrainCheckpointer` opens the directory.
  * retention: only the newest `max_to_keep` steps are kept (None keeps all).
  * re-sharding: `restore(target=...)` takes a tree of `jax.ShapeDtypeStruct` (or arrays)
    carrying the *new* shardings; each device reads only its part. Without a target, arrays
    come back with the shardings they were saved with (same topology only).
Replicated shards are written by one replica (`replica_parallel=False`, see `array_registry`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

_FORMAT = "avalon-train-v1"


def array_registry(replica_parallel: bool) -> ocp.type_handlers.TypeHandlerRegistry:
    """orbax's default type handlers, with replica-parallel array writes on or off.

    Replica-parallel (orbax's default except on GPU) splits each replicated shard among its
    replicas by slicing it on device: one small XLA program per distinct slice shape, compiled
    on the first save. On the tiny model over 8 CPU devices (2-core machine) that first save
    took 34 s (680 slice compiles) against 0.2 s without; off, replica 0 writes each shard."""
    th = ocp.type_handlers
    return th.create_type_handler_registry(
        (int, th.ScalarHandler()), (float, th.ScalarHandler()), (bytes, th.ScalarHandler()),
        (np.number, th.ScalarHandler()), (np.ndarray, th.NumpyHandler()),
        (jax.Array, th.ArrayHandler(use_replica_parallel=replica_parallel)),
        (str, th.StringHandler()))


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _keys_to_data(tree):
    """Replace typed PRNG keys by their key data; returns (tree, {path: impl name})."""
    leaves, treedef = jax.tree.flatten_with_path(tree)
    impls, out = {}, []
    for path, x in leaves:
        if _is_key(x):
            impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(x))
            x = jax.random.key_data(x)
        out.append(x)
    return jax.tree.unflatten(treedef, out), impls


def _abstract(x):
    """A restore target leaf: ShapeDtypeStruct with the leaf's sharding (key -> key data)."""
    sharding = getattr(x, "sharding", None)
    if _is_key(x):
        shaped = jax.eval_shape(jax.random.key_data, x)
        return jax.ShapeDtypeStruct(shaped.shape, shaped.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _data_to_keys(tree, impls: Mapping[str, str]):
    leaves, treedef = jax.tree.flatten_with_path(tree)
    out = []
    for path, x in leaves:
        impl = impls.get(jax.tree_util.keystr(path))
        out.append(x if impl is None else jax.random.wrap_key_data(x, impl=impl))
    return jax.tree.unflatten(treedef, out)


class TrainCheckpointer:
    """Numbered training checkpoints in `directory` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3,
                 async_save: bool = True, replica_parallel: bool = False):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"TrainCheckpointer: max_to_keep={max_to_keep} must be >= 1 or None")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True,
            cleanup_tmp_directories=True)
        handlers = {
            "state": ocp.PyTreeCheckpointHandler(
                type_handler_registry=array_registry(replica_parallel)),
            "host": ocp.JsonCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                           item_handlers=handlers)

    def save(self, step: int, state, host_state: Mapping | None = None, *,
             force: bool = False) -> bool:
        """Start saving `state` (pytree of arrays) and `host_state` (JSON dict) as `step`.
        Returns whether a save was started (False if `step` already exists)."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"TrainCheckpointer.save: step={step!r} must be an int >= 0")
        host_state = dict(host_state or {})
        try:
            json.dumps(host_state, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"TrainCheckpointer.save: host_state is not JSON-serialisable "
                             f"({e})") from None
        if step in self._mngr.all_steps():
            return False
        tree, impls = _keys_to_data(state)
        meta = {"format": _FORMAT, "prng_keys": impls}
        return self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(tree), host=ocp.args.JsonSave(host_state),
            meta=ocp.args.JsonSave(meta)), force=force)

    def restore(self, step: int | None = None, target=None):
        """(state, host_state) of `step` (default: the latest). `target`: a pytree like the
        saved state of ShapeDtypeStructs or arrays whose shardings say where each leaf goes."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"{self.directory}: no finished checkpoint to restore")
        elif step not in self.all_steps():
            raise FileNotFoundError(f"{self.directory}: no checkpoint for step {step} "
                                    f"(have {self.all_steps()})")
        meta = self._mngr.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{self.directory} step {step}: format {meta.get('format')!r} is "
                             f"not {_FORMAT!r}")
        if target is None:
            state_args = ocp.args.PyTreeRestore()
        else:
            item = jax.tree.map(_abstract, target)
            state_args = ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item))
        with warnings.catch_warnings():
            # Without a target orbax warns that saved shardings only suit the same topology,
            # which is this method's documented contract.
            warnings.filterwarnings("ignore", message="Sharding info not provided")
            got = self._mngr.restore(step, args=ocp.args.Composite(
                state=state_args, host=ocp.args.JsonRestore()))
        return _data_to_keys(got["state"], meta["prng_keys"]), dict(got["host"] or {})

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def wait(self) -> None:
        """Block until every started save is durable on disk."""
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager's threads."""
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self) -> TrainCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
