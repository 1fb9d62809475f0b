"""Hugging Face checkpoints (Nemotron-H, and the Llama/Qwen families of `hf_families.py`):
import onto a mesh, export to the hub layout.

    cfg, params = hf.load("/ckpt/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", mesh)
    hf.save("/out/my-org-model", cfg, params)

`load` reads config.json (`hf_config`), opens every safetensors header (`safetensors_io`),
checks that each tensor the config implies is present with the right shape (and that no tensor
is left over), then builds each avalon leaf directly on its devices: for every distinct shard
of the leaf's sharding it reads just the needed slices of the needed HF tensors (`hf_names`),
puts them on the devices holding that shard, and drops the host copy. No host ever holds more
than one shard of one leaf. Leaves take the params dtype of the checkpoint (config `dtype`, else
the embeddings' dtype) unless `param_dtype=` says otherwise; the router and its correction
bias are always fp32 (HF's `_keep_in_fp32_modules_strict`). `load_tensors` does the same from
any tensor source with `SafetensorsDir`'s reading interface and a config.json dict (a GGUF
file's, `gguf.py`).

`save` writes the hub layout (`backbone.*`, one key per expert, `mtp.*` when the model has an
MTP block, `lm_head.weight` even for tied embeddings since transformers never ties this model)
as sharded safetensors with `model.safetensors.index.json` (written last) and a
transformers-5.24 config.json. It copies leaves to the host one stacked layer at a time (leaves
under 256 MiB whole), so it needs every param addressable by this process (one host; use the
converter for multi-host training checkpoints).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from avalon.checkpoint import hf_config, hf_families, hf_names, hf_names_families
from avalon.checkpoint.safetensors_io import INDEX_NAME, SafetensorsDir, write_sharded
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params, param_shardings
from avalon.sharding import TRAIN_RULES, Rules

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' default "5GB"
# Export copies a leaf up to this size to the host whole (no device program needed); larger
# leaves one stacked layer at a time, so the host holds one layer of each of them.
_WHOLE_LEAF_BYTES = 1 << 28
# Keys of a source config.json that must not be carried into an export: remote code and
# quantization do not describe the exported weights, and legacy aliases would override the
# model's own fields when transformers reads them.
_DROP_FROM_EXTRA = ("auto_map", "torch_dtype", "quantization_config", "attention_head_dim",
                    *hf_config.LEGACY_KEYS)


class CheckpointError(ValueError):
    """A checkpoint does not match its config (missing / misshapen / unexpected tensor)."""


# ---- import ---------------------------------------------------------------------------------
def load(path: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, *,
         rules: Rules = TRAIN_RULES, progress: Progress | None = None,
         **overrides) -> tuple[ModelConfig, dict]:
    """Read a local HF checkpoint directory (Nemotron-H, Llama, Qwen2, Qwen3, Qwen3-MoE) or a
    GGUF file of those families. Returns (ModelConfig, params).

    mesh: place every leaf per `avalon.model.param_shardings(cfg, mesh, rules)`; None gives
    plain single-device arrays. overrides: ModelConfig fields (e.g. `param_dtype="float32"`,
    `moe_backend=...`, `max_context=...`); `dtype` follows `param_dtype` unless given.
    progress(done, total) is called after each leaf.
    """
    path = Path(path)
    if path.is_file() and is_gguf(path):
        return load_gguf(path, mesh, rules=rules, progress=progress, **overrides)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{path}: no config.json")
    raw = hf_config.read_json(cfg_path)
    st = SafetensorsDir(path)
    try:
        return load_tensors(raw, st, mesh, source=str(cfg_path), rules=rules,
                            progress=progress, **overrides)
    finally:
        st.close()


def is_gguf(path: str | os.PathLike) -> bool:
    """A file that starts with GGUF's magic (llama.cpp's single-file format)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def load_gguf(path: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, *,
              rules: Rules = TRAIN_RULES, progress: Progress | None = None,
              **overrides) -> tuple[ModelConfig, dict]:
    """`load` from a GGUF file (`checkpoint/gguf.py`): the HF config and tensors it stands for,
    dequantised to float32 one tensor at a time (params float32 unless `param_dtype=`)."""
    from avalon.checkpoint.gguf import GgufCheckpoint, GgufError

    try:
        ck = GgufCheckpoint(path)
    except GgufError as e:
        raise CheckpointError(str(e)) from None
    try:
        st = ck.tensors()
        return load_tensors(ck.hf_config(), st, mesh, source=str(path), rules=rules,
                            progress=progress, **overrides)
    finally:
        ck.close()


def load_tensors(raw: dict, st, mesh: jax.sharding.Mesh | None = None, *,
                 source: str = "config.json", rules: Rules = TRAIN_RULES,
                 progress: Progress | None = None, **overrides) -> tuple[ModelConfig, dict]:
    """`load` from a config.json dict and an open tensor source `st` (`SafetensorsDir`'s
    interface: keys, shape, dtype, read); the caller closes `st`."""
    if raw.get("model_type") in hf_families.MODEL_TYPES:
        embed = f"{hf_names_families.PREFIX}embed_tokens.weight"
        if "param_dtype" not in overrides and hf_config.checkpoint_dtype(raw) is None \
                and embed in st:
            overrides["param_dtype"] = str(st.dtype(embed))
        cfg = hf_config.from_hf(raw, source=source, **overrides)
        sources = hf_names_families.param_sources(cfg)
    else:
        layout = hf_names.detect_layout(st.keys())
        if "param_dtype" not in overrides and hf_config.checkpoint_dtype(raw) is None:
            embed = f"{layout.prefix}embeddings.weight"
            if embed in st:
                overrides["param_dtype"] = str(st.dtype(embed))
        # transformers 5.24 never ties Nemotron-H's head (`_tied_weights_keys = {}`): tie
        # only when the config asks for it *and* there is no head to load.
        tie = bool(raw.get("tie_word_embeddings", False)) and "lm_head.weight" not in st
        cfg = hf_config.from_hf({**raw, "tie_word_embeddings": tie}, source=source,
                                **overrides)
        sources = hf_names.param_sources(cfg, layout)
    hf_names.check_sources(cfg, sources)
    _check_tensors(st, sources, cfg)

    abstract = abstract_params(cfg)
    shard_tree = None if mesh is None else param_shardings(cfg, mesh, rules)
    src_leaves, treedef = jax.tree.flatten(sources, is_leaf=hf_names.is_source)
    dtypes = [a.dtype for a in jax.tree.leaves(abstract)]
    shardings = [None] * len(src_leaves) if shard_tree is None else jax.tree.leaves(shard_tree)
    out = []
    for k, (src, dtype, sharding) in enumerate(zip(src_leaves, dtypes, shardings)):
        out.append(_build_leaf(st, src, np.dtype(dtype), sharding))
        if progress is not None:
            progress(k + 1, len(src_leaves))
    return cfg, jax.tree.unflatten(treedef, out)


def _check_tensors(st: SafetensorsDir, sources, cfg: ModelConfig) -> None:
    """Every needed tensor present with the config's shape, and none left over."""
    need: dict[str, tuple[tuple[int, ...], str]] = {}
    for path, src in jax.tree.leaves_with_path(sources, is_leaf=hf_names.is_source):
        for name in src.names.flat:
            need.setdefault(name, (src.view.hf_shape, jax.tree_util.keystr(path)))
    missing = [n for n in need if n not in st]
    if missing:
        name, (_, leaf) = missing[0], need[missing[0]]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{st.directory}: tensor {name!r} is missing{more}; avalon param "
                              f"{leaf} needs it for config.json's model")
    for name, (shape, leaf) in need.items():
        if st.shape(name) != shape:
            raise CheckpointError(
                f"{st.file_of(name)}: tensor {name!r} has shape {list(st.shape(name))} but "
                f"config.json implies {list(shape)} (avalon param {leaf})")
    extra = sorted(n for n in st.keys() if n not in need)
    if cfg.tie_word_embeddings and "lm_head.weight" in extra and cfg.rope_theta is not None:
        # transformers ties a Llama/Qwen head to the embeddings and ignores a stored copy.
        extra.remove("lm_head.weight")
    if not cfg.mtp_pattern:
        # transformers ignores `mtp.*` (it builds no MTP block); so do we when the config
        # declares none.
        skipped = [n for n in extra if n.startswith("mtp.")]
        if skipped:
            log.warning("%s: ignoring %d mtp.* tensors (config.json has no MTP block)",
                        st.directory, len(skipped))
        extra = [n for n in extra if not n.startswith("mtp.")]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{st.directory}: tensor {extra[0]!r}{more} is not used by the "
                              "model config.json describes; refusing to drop it silently")


def _ranges(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for s, n in zip(index, shape):
        lo, hi, step = s.indices(n)
        if step != 1:
            raise ValueError(f"strided shard index {index} is not supported")
        out.append((lo, hi))
    return tuple(out)


def _host_block(st: SafetensorsDir, src: hf_names.Source, region, dtype) -> np.ndarray:
    """The leaf's `region` as a numpy array, reading only what it needs."""
    ns = src.names.ndim
    stack, inner = region[:ns], region[ns:]
    out = np.empty(tuple(hi - lo for lo, hi in region), dtype)
    for pos in np.ndindex(*(hi - lo for lo, hi in stack)):
        name = src.names[tuple(lo + p for p, (lo, _) in zip(pos, stack))]
        block = src.view.read(lambda r, name=name: st.read(name, r), inner)
        out[pos] = block.astype(dtype, copy=False)
    return out


def _build_leaf(st: SafetensorsDir, src: hf_names.Source, dtype: np.dtype, sharding):
    shape = src.shape
    if sharding is None:
        full = tuple((0, n) for n in shape)
        return jax.device_put(_host_block(st, src, full, dtype))
    # One host read per distinct shard; replicas of it reuse that read. Each host block is
    # dropped once its devices have it, so the host holds one shard at a time.
    by_region: dict[tuple, list] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        by_region.setdefault(_ranges(index, shape), []).append(device)
    arrays = []
    for region, devices in by_region.items():
        host = _host_block(st, src, region, dtype)
        placed = [jax.device_put(host, d) for d in devices]
        jax.block_until_ready(placed)
        arrays += placed
        del host
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


# ---- export ---------------------------------------------------------------------------------
_LAYER = re.compile(r"^(backbone\.layers|model\.layers|mtp\.layers)\.(\d+)\.")


def _group(name: str) -> tuple:
    """Write order: embeddings, layers in order, final norm, head, MTP layers."""
    m = _LAYER.match(name)
    if m:
        return (4 if m.group(1) == "mtp.layers" else 1, int(m.group(2)))
    return {"backbone.embeddings.weight": (0,), "model.embed_tokens.weight": (0,),
            "backbone.norm_f.weight": (2,), "model.norm.weight": (2,),
            "lm_head.weight": (3,)}.get(name, (5,))


def save(path: str | os.PathLike, cfg: ModelConfig, params: dict, *,
         max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, extra_config: dict | None = None,
         progress: Progress | None = None) -> None:
    """Write `params` as a hub-layout HF checkpoint that transformers 5.24 loads.

    extra_config: keys to carry into config.json that the model config does not know (token
    ids, `rope_theta`, ...); the model's own fields always win. progress(done, total) is called
    after each tensor. `path` must not already hold a safetensors checkpoint.
    """
    path = Path(path)
    if path.exists() and (any(path.glob("*.safetensors")) or (path / INDEX_NAME).exists()):
        raise CheckpointError(f"{path}: already holds a safetensors checkpoint; export into a "
                              "new or empty directory")
    _check_params(cfg, params)
    try:
        kind = hf_families.family(cfg)
    except hf_families.FamilyConfigError as e:
        raise CheckpointError(f"hf.save: {e}") from None
    if kind is None:
        sources = hf_names.param_sources(cfg, hf_names.HUB)
    else:
        sources = hf_names_families.param_sources(cfg)
    config_json = hf_config.to_hf(cfg)
    hf_names.check_sources(cfg, sources)
    src_leaves = jax.tree.leaves(sources, is_leaf=hf_names.is_source)
    leaves = jax.tree.leaves(params)

    # HF tensor -> [(leaf number, position in the leaf's name array)], in write order.
    parts: dict[str, list[tuple[int, tuple]]] = {}
    for k, src in enumerate(src_leaves):
        for pos in np.ndindex(*src.names.shape):
            parts.setdefault(src.names[pos], []).append((k, pos))
    if cfg.tie_word_embeddings and kind is None:
        # transformers 5.24 never ties Nemotron-H's head: write it out, or it would be random.
        parts["lm_head.weight"] = parts["backbone.embeddings.weight"]
    first = {name: i for i, name in enumerate(parts)}
    order = sorted(parts, key=lambda n: (_group(n), first[n]))
    specs = []
    for name in order:
        dts = {np.dtype(leaves[k].dtype) for k, _ in parts[name]}
        specs.append((name, src_leaves[parts[name][0][0]].view.hf_shape, np.result_type(*dts)))

    def tensors():
        small: dict[int, np.ndarray] = {}  # whole small leaves, fetched once
        layer: dict[tuple[int, int], np.ndarray] = {}  # one layer of large leaves
        group = None
        for name, shape, dtype in specs:
            if _group(name) != group:  # a new layer: drop the previous layer's host copies
                layer.clear()
                group = _group(name)
            out = np.empty(shape, dtype)
            for k, pos in parts[name]:
                src, leaf = src_leaves[k], leaves[k]
                if not pos or leaf.nbytes <= _WHOLE_LEAF_BYTES:
                    if k not in small:
                        small[k] = _fetch(leaf, None)
                    x = small[k][pos]
                else:
                    if (k, pos[0]) not in layer:
                        layer[(k, pos[0])] = _fetch(leaf, pos[0])
                    x = layer[(k, pos[0])][pos[1:]]
                seg = src.view.to_hf(np.asarray(x)).astype(dtype, copy=False)
                rows = src.view.rows
                if rows is None:
                    out[...] = seg
                else:
                    out[rows[0]:rows[1]] = seg
            yield out

    path.mkdir(parents=True, exist_ok=True)
    extra = {k: v for k, v in (extra_config or {}).items() if k not in _DROP_FROM_EXTRA}
    hf_config.write_json(path / "config.json", {**extra, **config_json})
    write_sharded(path, specs, tensors(), max_shard_bytes, progress=progress)


def _check_params(cfg: ModelConfig, params) -> None:
    abstract = abstract_params(cfg)
    if jax.tree.structure(params) != jax.tree.structure(abstract):
        raise CheckpointError("params do not have the structure of the config's params "
                              f"(expected {jax.tree.structure(abstract)})")
    for (p, x), a in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(abstract)):
        if tuple(x.shape) != tuple(a.shape):
            raise CheckpointError(f"param {jax.tree_util.keystr(p)} has shape {x.shape}, the "
                                  f"config implies {a.shape}")


@jax.jit
def _take(a, i):
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def _fetch(leaf, i: int | None) -> np.ndarray:
    """Leaf (or its slice i along the stacked axis) as a host array."""
    if isinstance(leaf, np.ndarray):
        return leaf if i is None else leaf[i]
    if not leaf.is_fully_addressable:
        raise CheckpointError("hf.save needs every param addressable by this process; save an "
                              "orbax checkpoint and export it with avalon.tools.convert")
    return np.asarray(leaf if i is None else _take(leaf, i))
