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

Integrity (ours, on top of orbax): `save` records in the step's `meta` item (written with the
step, so atomic with it) the step number, every array's shape, dtype and content sum
(`content_sums.py`: the same for any sharding, so it is checked after a re-sharded restore
too), a sha256 of the host state, and a BLAKE2b digest of all of that. `restore` verifies
everything, always (there is one format and no field turns a check off): the digest first (a
flipped bit anywhere in the meta, its format, a shape, a sum, is corruption), then the step (a
step directory that is a link, or a copy of another step, restores as nothing), then every
array's content sum and the host state's. Every failure raises `CheckpointCorruptError` naming
the file (or item directory) at fault: a flipped bit, a missing or undecodable file, corrupt
JSON, a meta of another format (checkpoints written before `avalon-train-v3` included).
Threat model: these checks find corruption (a failing disk, a torn or partial copy, a step
directory that is a link to or a copy of another step), not forgery. The content sums and the
digest are unkeyed, so anyone who can write the checkpoint directory can make a checkpoint that
passes every check (saving one with this very class is enough). Keep checkpoints where only the
trainer writes; to trust one from elsewhere, check a signature made outside Avalon.
`restore_newest_intact` walks back from the newest step past corrupt ones, logs each one it
skips and why, and returns them; `quarantine(step)` renames a corrupt step aside
(`<step>.corrupt`) so that it can be written again. A target whose shapes differ from the
saved ones (the meta intact) is a plain ValueError (a changed config, not corruption: no
fallback).

A save that fails (a full disk: orbax raises from its background write at `wait`, `close` or
the next `save`) leaves the manager consistent: the half-written step's temporary directory is
removed, the manager re-reads the steps on disk (so it lists the intact ones, and the next save
and retention work from them), and `CheckpointSaveError` says which steps remain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from avalon import paths
from avalon.checkpoint.content_sums import content_sums

# v2: content sums in meta; v3: (S0, H) content sums, the step, and a BLAKE2b digest.
_FORMAT = "avalon-train-v3"
_TMP_STEP = re.compile(r"[0-9]+\.orbax-checkpoint-tmp.*")  # orbax's half-written steps
log = logging.getLogger(__name__)


class CheckpointCorruptError(ValueError):
    """A checkpoint step that cannot be trusted; the message starts with the file at fault."""


class CheckpointSaveError(OSError):
    """A save did not complete (e.g. the disk is full); the steps on disk are intact."""


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: Any
    host_state: dict
    skipped: tuple[tuple[int, str], ...]  # (step, why) of newer steps found corrupt


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


def _leaf_name(path) -> str:
    """A leaf's path as orbax names it on disk ('opt_state/0/mu/w'): the same whether the tree
    came back with its namedtuples (a target) or as plain dicts (no target)."""
    names = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            names.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            names.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            names.append(str(k.idx))
        else:
            names.append(str(k))
    return "/".join(names)


def _describe(tree) -> dict[str, dict]:
    """{leaf name: {shape, dtype, sum}} of a tree of arrays (keys already as key data)."""
    leaves = jax.tree.leaves_with_path(tree)
    sums = content_sums([x for _, x in leaves])
    return {_leaf_name(p): {"shape": list(np.shape(x)), "dtype": str(_dtype(x)), "sum": s}
            for (p, x), s in zip(leaves, sums)}


def _dtype(x) -> np.dtype:
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
        return np.dtype(x.dtype)
    return np.asarray(x).dtype  # a Python scalar


def _host_sum(host_state: Mapping) -> str:
    return hashlib.sha256(json.dumps(host_state, sort_keys=True, allow_nan=False)
                          .encode()).hexdigest()


def _meta_digest(meta: Mapping) -> str:
    """BLAKE2b of the meta's fields other than `digest` (canonical JSON)."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, allow_nan=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=32).hexdigest()


def _is_link(path: epath.Path) -> bool:
    """Whether a local path is a symbolic link (remote stores have none)."""
    try:
        return os.path.islink(os.fspath(path))
    except TypeError:
        return False


def _data_to_keys(tree, impls: Mapping[str, str]):
    leaves, treedef = jax.tree.flatten_with_path(tree)
    out = []
    for path, x in leaves:
        impl = impls.get(jax.tree_util.keystr(path))
        out.append(x if impl is None else jax.random.wrap_key_data(x, impl=impl))
    return jax.tree.unflatten(treedef, out)


def _check_target(item, saved: Mapping[str, dict], meta_file: epath.Path) -> None:
    """A target that differs from the saved arrays is a config change: a ValueError."""
    names = {}
    for path, leaf in jax.tree.leaves_with_path(item):
        names[_leaf_name(path)] = (list(leaf.shape), str(np.dtype(leaf.dtype)))
    want = {k: (v.get("shape"), v.get("dtype")) if isinstance(v, dict) else None
            for k, v in saved.items()}
    if names != want:
        diff = sorted(k for k in names.keys() | want.keys() if names.get(k) != want.get(k))
        k = diff[0]
        raise ValueError(f"{meta_file}: the restore target does not match the saved state at "
                         f"{k!r}: target {names.get(k)}, saved {want.get(k)} "
                         f"({len(diff)} leaves differ)")


def _verify(state, saved: Mapping[str, dict], state_dir: epath.Path) -> None:
    """Every restored array's content sum equals the saved one, else names the array."""
    leaves = jax.tree.leaves_with_path(state)
    got = dict(zip((_leaf_name(p) for p, _ in leaves), content_sums([x for _, x in leaves])))
    if got.keys() != saved.keys():
        missing = sorted(saved.keys() ^ got.keys())
        raise CheckpointCorruptError(f"{state_dir}: arrays {missing[:3]} are in only one of "
                                     "the saved state and its meta")
    for name, s in got.items():
        want = saved[name].get("sum") if isinstance(saved[name], dict) else None
        if s != want:
            raise CheckpointCorruptError(f"{state_dir}: array {name!r} does not match its saved "
                                         f"content sum ({s} now, {want} saved): its data "
                                         "files are corrupt")


class TrainCheckpointer:
    """Numbered training checkpoints in `directory` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3,
                 async_save: bool = True, replica_parallel: bool = False,
                 ocdbt: bool = True):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"TrainCheckpointer: max_to_keep={max_to_keep} must be >= 1 or None")
        self.directory = paths.path(directory)  # a gs:// URL stays one (orbax takes epath)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True,
            cleanup_tmp_directories=True)
        handlers = {
            # ocdbt=False: one zarr store per array, for a storage server without the
            # conditional writes OCDBT's manifest needs (restores read either format).
            "state": ocp.PyTreeCheckpointHandler(
                use_ocdbt=ocdbt, type_handler_registry=array_registry(replica_parallel)),
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
        # Summed now, from the live arrays (the caller may donate them once save returns).
        meta = {"format": _FORMAT, "step": step, "prng_keys": impls, "arrays": _describe(tree),
                "host_sum": _host_sum(host_state)}
        meta["digest"] = _meta_digest(meta)
        return self._guarded(lambda: self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(tree), host=ocp.args.JsonSave(host_state),
            meta=ocp.args.JsonSave(meta)), force=force))

    def _guarded(self, fn):
        """Runs a manager call; a save that failed (now or in the background) is cleaned up
        and reported as CheckpointSaveError (see the module docstring)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            self._recover()
            message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            raise CheckpointSaveError(f"{self.directory}: a checkpoint save did not complete "
                                      f"({message}); the steps on disk are {self.all_steps()}"
                                      ) from e

    def _recover(self) -> None:
        """After a failed save: drop its half-written step, re-read the steps on disk."""
        if jax.process_index() == 0:
            try:
                names = [p.name for p in self.directory.iterdir()]
            except OSError:
                names = []
            for name in names:
                if _TMP_STEP.fullmatch(name):
                    path = self.directory / name
                    if os.path.isdir(os.fspath(path)):  # local: frees the space now
                        shutil.rmtree(os.fspath(path), ignore_errors=True)
                    else:
                        path.rmtree(missing_ok=True)
        try:
            self._mngr.reload()
        except Exception as e:  # noqa: BLE001 - reported with the save's own error
            log.warning("%s: the checkpoint manager could not re-read its steps: %s",
                        self.directory, e)

    def restore(self, step: int | None = None, target=None):
        """(state, host_state) of `step` (default: the latest), verified against the saved
        content sums. `target`: a pytree like the saved state of ShapeDtypeStructs or arrays
        whose shardings say where each leaf goes. A corrupt step raises
        CheckpointCorruptError (no fallback here: see `restore_newest_intact`)."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"{self.directory}: no finished checkpoint to restore")
        elif step not in self.all_steps():
            raise FileNotFoundError(f"{self.directory}: no checkpoint for step {step} "
                                    f"(have {self.all_steps()})")
        return self._restore_step(step, target)

    def restore_newest_intact(self, target=None) -> Restored:
        """The newest step that restores and verifies, with the newer ones it skipped (and
        why). FileNotFoundError when there is no step; CheckpointCorruptError listing every
        step's fault when none is intact."""
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"{self.directory}: no finished checkpoint to restore")
        skipped: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                state, host = self._restore_step(step, target)
            except CheckpointCorruptError as e:
                log.warning("checkpoint step %d skipped (corrupt): %s", step, e)
                skipped.append((step, str(e)))
                continue
            return Restored(step, state, host, tuple(skipped))
        raise CheckpointCorruptError(f"{self.directory}: no intact checkpoint: " +
                                     "; ".join(f"step {s}: {why}" for s, why in skipped))

    def quarantine(self, step: int) -> epath.Path:
        """Renames step `step` aside to `<step>.corrupt` (kept for a post-mortem; orbax no
        longer lists it, so the step can be saved again). Returns the new path."""
        src = self.step_dir(step)
        dst = src.with_name(f"{src.name}.corrupt")
        n = 1
        while dst.exists():
            n += 1
            dst = src.with_name(f"{src.name}.corrupt{n}")
        if jax.process_index() == 0:
            src.rename(dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"avalon-quarantine-{step}")
        self._mngr.reload()
        return dst

    def step_dir(self, step: int) -> epath.Path:
        return self.directory / str(step)

    def _item(self, step: int, item: str, args, path: epath.Path):
        """One orbax item of `step`; any failure to read it names `path`."""
        try:
            with warnings.catch_warnings():
                # Without a target orbax warns that saved shardings only suit the same
                # topology, which is `restore`'s documented contract.
                warnings.filterwarnings("ignore", message="Sharding info not provided")
                return self._mngr.restore(step, args=ocp.args.Composite(**{item: args}))[item]
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many kinds
            message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            raise CheckpointCorruptError(f"{path}: cannot be read ({message})") from e

    def _meta(self, step: int) -> dict:
        """The step's meta, verified: its digest, format and step (module docstring)."""
        d = self.step_dir(step)
        meta_file = d / "meta" / "metadata"
        if _is_link(d):
            raise CheckpointCorruptError(f"{d}: the step directory is a symbolic link")
        meta = self._item(step, "meta", ocp.args.JsonRestore(), meta_file)
        if not isinstance(meta, dict):
            raise CheckpointCorruptError(f"{meta_file}: not a checkpoint meta object")
        try:
            digest = _meta_digest(meta)
        except (TypeError, ValueError) as e:
            raise CheckpointCorruptError(f"{meta_file}: not a checkpoint meta object ({e})") \
                from None
        if meta.get("digest") != digest:
            raise CheckpointCorruptError(
                f"{meta_file}: its BLAKE2b digest does not match its content (format "
                f"{meta.get('format')!r}; this code writes and reads {_FORMAT!r})")
        if meta.get("format") != _FORMAT:
            raise CheckpointCorruptError(f"{meta_file}: format {meta.get('format')!r} is not "
                                         f"{_FORMAT!r}")
        if meta.get("step") != step:
            raise CheckpointCorruptError(f"{meta_file}: records step {meta.get('step')!r}, but "
                                         f"it is in the directory of step {step} (a copy or a "
                                         "link of another step)")
        if not isinstance(meta.get("prng_keys"), dict) or not isinstance(meta.get("arrays"),
                                                                         dict):
            raise CheckpointCorruptError(f"{meta_file}: has no prng_keys or content sums")
        return meta

    def _restore_step(self, step: int, target):
        d = self.step_dir(step)
        meta_file = d / "meta" / "metadata"
        meta = self._meta(step)
        saved = meta["arrays"]
        if target is None:
            state_args = ocp.args.PyTreeRestore()
        else:
            item = jax.tree.map(_abstract, target)
            _check_target(item, saved, meta_file)  # the meta is intact: a config change
            state_args = ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item))
        state = self._item(step, "state", state_args, d / "state")
        host_file = d / "host" / "metadata"
        host = self._item(step, "host", ocp.args.JsonRestore(), host_file)
        host = {} if host is None else host
        if not isinstance(host, dict):
            raise CheckpointCorruptError(f"{host_file}: not a JSON object")
        _verify(state, saved, d / "state")
        if _host_sum(host) != meta.get("host_sum"):
            raise CheckpointCorruptError(f"{host_file}: sha256 differs from the one saved in "
                                         f"{meta_file}")
        try:
            return _data_to_keys(state, meta["prng_keys"]), host
        except Exception as e:  # noqa: BLE001 - an impl name JAX does not know
            raise CheckpointCorruptError(f"{meta_file}: PRNG keys cannot be rebuilt ({e})") \
                from None

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def wait(self) -> None:
        """Block until every started save is durable on disk (CheckpointSaveError if one
        failed)."""
        self._guarded(self._mngr.wait_until_finished)

    def close(self) -> None:
        """Finish pending saves and release the manager's threads (CheckpointSaveError, after
        releasing them, if a pending save failed)."""
        try:
            self._guarded(self._mngr.wait_until_finished)
        finally:
            self._mngr.close()

    def __enter__(self) -> TrainCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
