"""GGUF files (llama.cpp's format) read as Hugging Face checkpoints.

`GgufCheckpoint(path)` opens a GGUF file with the `gguf` package's memory-mapped reader and
presents it as the transformers checkpoint of the same model:

  hf_config()  the config.json dict (`avalon/checkpoint/gguf_config.py`) of LlamaForCausalLM,
               Qwen2ForCausalLM, Qwen3ForCausalLM or Qwen3MoeForCausalLM;
  tensors()    a reader with `SafetensorsDir`'s interface (keys, shape, dtype, read(name, region),
               file_of, directory, close) under the HF checkpoint's tensor names, values float32
               dequantised by the `gguf` package, one tensor at a time.

What llama.cpp's convert_hf_to_gguf.py does on the way in, undone here:
  * ggml lists dimensions fastest first: GGUF's [in, out] is torch's [out, in].
  * For the `llama` architecture it reorders the rows of q_proj and k_proj (weights and biases)
    within each head, from HF's rotate-half layout (dimension i paired with i + d/2) to
    interleaved pairs (2i with 2i + 1); reading applies the inverse.
  * Qwen3-MoE's experts are stacked, one [expert, out, in] tensor per projection
    (`ffn_{gate,up,down}_exps`); each expert is read as its own HF tensor
    `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight` (the Hub checkpoints' names).
  * Tied embeddings are written once: there is `lm_head.weight` only when the file has
    `output.weight`. Llama 3's `rope_freqs.weight` is config (rope_scaling), not a tensor.

A file that is not GGUF, is truncated, or holds an architecture, a tensor type or a tensor this
importer does not know is refused when opened with one line naming the file and the field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from avalon.checkpoint.gguf_config import MODEL_TYPES, GgufConfigError, hf_config


class GgufError(ValueError):
    """A GGUF file Avalon cannot import; the message names the file and the field."""


def _types():
    from gguf import GGMLQuantizationType as T

    return {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
            T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}


SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_ATTN = {"attn_norm.weight": "input_layernorm.weight",
         "ffn_norm.weight": "post_attention_layernorm.weight",
         **{f"attn_{g}.{p}": f"self_attn.{h}_proj.{p}"
            for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
            for p in ("weight", "bias")}}
_QK_NORM = {"attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight"}
_DENSE = {f"ffn_{p}.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
_ROUTER = {"ffn_gate_inp.weight": "mlp.gate.weight"}
_EXPERTS = {f"ffn_{p}_exps.weight": f"{p}_proj.weight" for p in ("gate", "up", "down")}
# The per-layer tensors each architecture may hold (GGUF suffix -> HF suffix).
_LAYER_NAMES = {"llama": {**_ATTN, **_DENSE}, "qwen2": {**_ATTN, **_DENSE},
                "qwen3": {**_ATTN, **_QK_NORM, **_DENSE},
                "qwen3moe": {**_ATTN, **_QK_NORM, **_ROUTER, **_EXPERTS}}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
_MISSING = object()


class _Entry(NamedTuple):
    tensor: object  # gguf.ReaderTensor: type, and its data as a view of the memory map
    expert: int | None  # index into a stacked experts tensor
    shape: tuple[int, ...]  # torch order
    heads: int | None  # llama's q/k rows to un-permute, in this many heads


def _open_reader(path: Path):
    from gguf import GGUFReader

    try:
        size = path.stat().st_size
    except OSError as e:
        raise GgufError(f"{path}: cannot open ({e.strerror})") from None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GgufError(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
        raise GgufError(f"{path}: truncated or corrupt GGUF file of {size} bytes "
                        f"({type(e).__name__}: {e})") from None
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise GgufError(f"{path}: truncated: tensor {t.name} ends at byte "
                            f"{t.data_offset + t.n_bytes} but the file has {size} bytes")
    return reader


class GgufCheckpoint:
    """One GGUF file; see the module docstring. Opening reads and validates the metadata and
    the tensor table (no tensor data)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._reader = _open_reader(self.path)
        self._fields = self._reader.fields
        arch = self.metadata("general.architecture")
        if arch not in MODEL_TYPES:
            raise GgufError(f"{self.path}: general.architecture is {arch!r}; Avalon imports "
                            f"{', '.join(MODEL_TYPES)}")
        self.architecture = arch
        supported = _types()
        for t in self._reader.tensors:
            if t.tensor_type not in supported:
                raise GgufError(f"{self.path}: tensor {t.name} has type {t.tensor_type.name}; "
                                f"Avalon reads {', '.join(SUPPORTED_TYPES)}")
        self._by_name = {t.name: t for t in self._reader.tensors}
        self._shapes = {t.name: tuple(int(n) for n in reversed(t.shape))
                        for t in self._reader.tensors}
        self._config: dict | None = None

    def metadata(self, key: str, default=_MISSING):
        """The value of one metadata key (str, int, float, bool or list); `default` when absent,
        or a GgufError naming the key when no default is given."""
        field = self._fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GgufError(f"{self.path}: metadata key {key} is missing")
            return default
        return field.contents()

    def hf_config(self) -> dict:
        """The config.json dict transformers would use for this model (a fresh copy)."""
        if self._config is None:
            freqs = None
            if "rope_freqs.weight" in self._by_name:
                freqs = _dequantize(self._by_name["rope_freqs.weight"].data,
                                    self._by_name["rope_freqs.weight"].tensor_type)
            try:
                self._config = hf_config(self.metadata, self._shapes, str(self.path), freqs)
            except GgufConfigError as e:
                raise GgufError(str(e)) from None
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._config.items()}

    def tensors(self) -> GgufTensors:
        """The model's tensors under their HF names (validated against the config)."""
        cfg = self.hf_config()
        layer_names = _LAYER_NAMES[self.architecture]
        permute = self.architecture == "llama"
        entries: dict[str, _Entry] = {}
        for t in self._reader.tensors:
            shape = self._shapes[t.name]
            if t.name in _GLOBAL:
                entries[_GLOBAL[t.name]] = _Entry(t, None, shape, None)
                continue
            if t.name == "rope_freqs.weight" and self.architecture == "llama":
                continue  # config: rope_scaling
            m = _BLOCK.fullmatch(t.name)
            suffix = m and m.group(2)
            if suffix not in layer_names:
                raise GgufError(f"{self.path}: tensor {t.name} is not part of a "
                                f"{self.architecture} model Avalon imports")
            prefix = f"model.layers.{m.group(1)}."
            if suffix in _EXPERTS:
                for e in range(shape[0]):
                    name = f"{prefix}mlp.experts.{e}.{_EXPERTS[suffix]}"
                    entries[name] = _Entry(t, e, shape[1:], None)
                continue
            heads = None
            if permute and suffix.startswith(("attn_q.", "attn_k.")):
                heads = cfg["num_attention_heads" if suffix.startswith("attn_q.")
                            else "num_key_value_heads"]
            entries[prefix + layer_names[suffix]] = _Entry(t, None, shape, heads)
        return GgufTensors(self.path, entries)

    def close(self):
        self._reader = self._fields = self._by_name = None


_CHUNK_BYTES = 16 << 20  # float32 output per dequantise call: bounds gguf's temporaries


def _dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """float32 values of `raw` (rows of ggml blocks or plain floats), a new array. A large
    tensor is dequantised a block of rows at a time into the result, so the `gguf` package's
    temporaries (a few times their output) stay small beside the result."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    if qtype == T.F32:
        return np.array(raw, dtype=np.float32)  # a copy: `raw` is a view of the memory map
    if raw.ndim < 2:
        return np.asarray(dequantize(np.asarray(raw), qtype), dtype=np.float32)
    first = np.asarray(dequantize(np.asarray(raw[:1]), qtype), dtype=np.float32)
    out = np.empty((raw.shape[0], *first.shape[1:]), np.float32)
    step = max(1, _CHUNK_BYTES // max(first.nbytes, 1))
    for lo in range(0, raw.shape[0], step):
        out[lo:lo + step] = dequantize(np.asarray(raw[lo:lo + step]), qtype)
    return out


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row order: within each head, GGUF row 2i + j is HF row
    j * d/2 + i (j in {0, 1})."""
    rest = w.shape[1:]
    return w.reshape(heads, -1, 2, *rest).swapaxes(1, 2).reshape(w.shape)


class GgufTensors:
    """A GGUF file's tensors under HF names, with `SafetensorsDir`'s reading interface.

    Every tensor is float32. `read(name)` dequantises that tensor and hands it over.
    `read(name, region)` keeps the last whole tensor it dequantised, so reading the tensor
    region by region (one shard per device) dequantises it once; a region of rows of a tensor
    whose rows are not reordered dequantises only those rows. At most one dequantised tensor is
    held at a time.
    """

    def __init__(self, path: Path, entries: dict[str, _Entry]):
        self.path = path
        self.directory = path.parent
        self._entries = entries
        self._cached: tuple[str, np.ndarray] | None = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def file_of(self, name: str) -> Path:
        self._entries[name]  # noqa: B018 (KeyError for an unknown name)
        return self.path

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def dtype(self, name: str) -> np.dtype:
        self._entries[name]  # noqa: B018
        return np.dtype(np.float32)

    def _values(self, e: _Entry, rows: tuple[int, int] | None = None) -> np.ndarray:
        raw = e.tensor.data if e.expert is None else e.tensor.data[e.expert]
        if rows is not None:
            raw = raw[rows[0]:rows[1]]
        out = _dequantize(raw, e.tensor.tensor_type)
        shape = e.shape if rows is None else (rows[1] - rows[0], *e.shape[1:])
        if out.shape != shape:
            raise GgufError(f"{self.path}: tensor {e.tensor.name} dequantised to shape "
                            f"{list(out.shape)}, expected {list(shape)}")
        return _unpermute_rows(out, e.heads) if e.heads else out

    def read(self, name: str, region=None) -> np.ndarray:
        """The tensor, or its `region` (one (start, stop) per axis), as a new float32 array."""
        e = self._entries[name]
        if region is None:
            if self._cached is not None and self._cached[0] == name:
                return self._cached[1].copy()
            return self._values(e)
        region = [(int(lo), int(hi)) for lo, hi in region]
        if len(region) != len(e.shape):
            raise ValueError(f"tensor {name!r}: region {region} does not match rank "
                             f"{len(e.shape)}")
        index = tuple(slice(lo, hi) for lo, hi in region)
        if self._cached is not None and self._cached[0] == name:
            return np.array(self._cached[1][index])
        lo, hi = region[0]
        if e.heads is None and len(e.shape) > 1 and (lo, hi) != (0, e.shape[0]):
            return np.ascontiguousarray(self._values(e, (lo, hi))[(slice(None), *index[1:])])
        self._cached = None  # release the previous tensor before dequantising this one
        self._cached = (name, self._values(e))
        return np.array(self._cached[1][index])

    def close(self):
        self._cached = None
        self._entries = {}
