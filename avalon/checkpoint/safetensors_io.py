"""Reading and writing (sharded) safetensors directories, one tensor region at a time.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length n,
n bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}`,
then the data buffer; offsets are relative to the buffer. A sharded checkpoint adds
`model.safetensors.index.json` with a `weight_map` {tensor name: file name}.

Written here rather than through the `safetensors` package because (1) that package is only in
the optional `hf` extra, while importing a published base model is core functionality, and
(2) reading goes through `numpy.memmap`, so a caller slicing one shard of one tensor pages in
only those bytes, for every dtype (bf16 and fp8 via `ml_dtypes`, which JAX already needs).
Every header is validated when the directory is opened, so a truncated or corrupt file is
reported by name before any tensor is read. The tests cross-check both directions against the
`safetensors` package when it is installed.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

INDEX_NAME = "model.safetensors.index.json"

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
# A header larger than this is certainly corrupt (real headers are a few MB at most).
_MAX_HEADER = 1 << 30


class SafetensorsError(ValueError):
    """A safetensors file or directory is malformed; the message names the file (and tensor)."""


def dtype_name(dtype) -> str:
    """The safetensors dtype string of a numpy dtype (e.g. bfloat16 -> 'BF16')."""
    dt = np.dtype(dtype)
    if dt not in _NAMES:
        raise SafetensorsError(f"dtype {dt} cannot be stored in safetensors")
    return _NAMES[dt]


class _File:
    """One validated safetensors file: its header, and a lazily opened read-only memmap."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        if size < 8:
            raise SafetensorsError(f"{path}: truncated: {size} bytes, not even a header length")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER or 8 + n > size:
                raise SafetensorsError(
                    f"{path}: truncated or corrupt: header length {n} but the file has {size} "
                    "bytes")
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + n
        self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        for name, e in header.items():
            self.entries[name] = self._entry(name, e, size)
        self._mm: np.memmap | None = None

    def _entry(self, name, e, size):
        where = f"{self.path}: tensor {name!r}"
        try:
            dtype = _DTYPES[e["dtype"]]
            shape = tuple(int(s) for s in e["shape"])
            begin, end = (int(o) for o in e["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise SafetensorsError(f"{where}: malformed header entry {e!r} ({err!r})") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes or begin < 0:
            raise SafetensorsError(
                f"{where}: data_offsets {[begin, end]} hold {end - begin} bytes but dtype "
                f"{e['dtype']} shape {list(shape)} needs {nbytes}")
        if self.data_start + end > size:
            raise SafetensorsError(
                f"{where}: file is truncated: the tensor's data ends at byte "
                f"{self.data_start + end} but the file has {size} bytes")
        return dtype, shape, begin

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the whole tensor on the memmap (no bytes read until sliced)."""
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype, shape, begin = self.entries[name]
        return np.ndarray(shape, dtype, buffer=self._mm, offset=self.data_start + begin)

    def close(self):
        self._mm = None


class SafetensorsDir:
    """The tensors of a checkpoint directory: `model.safetensors.index.json` + its files, or
    every `*.safetensors` file in the directory when there is no index.

    `shape(name)`, `dtype(name)`, `read(name, region)` where region is one (start, stop) per
    axis; only that region's bytes are read from disk.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise SafetensorsError(f"{self.directory}: not a directory")
        index = self.directory / INDEX_NAME
        self._where: dict[str, _File] = {}
        if index.exists():
            self._open_indexed(index)
        else:
            files = sorted(self.directory.glob("*.safetensors"))
            if not files:
                raise SafetensorsError(f"{self.directory}: no *.safetensors files and no "
                                       f"{INDEX_NAME}")
            for p in files:
                f = _File(p)
                for name in f.entries:
                    if name in self._where:
                        raise SafetensorsError(
                            f"tensor {name!r} is in both {self._where[name].path.name} and "
                            f"{p.name} of {self.directory}")
                    self._where[name] = f

    def _open_indexed(self, index: Path):
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SafetensorsError(f"{index}: not a safetensors index ({e!r})") from None
        files: dict[str, _File] = {}
        for name, fname in weight_map.items():
            if fname not in files:
                path = self.directory / fname
                if not path.exists():
                    raise SafetensorsError(f"{index}: tensor {name!r} is in {fname}, which "
                                           "does not exist")
                files[fname] = _File(path)
            f = files[fname]
            if name not in f.entries:
                raise SafetensorsError(f"{index}: tensor {name!r} is mapped to {fname}, whose "
                                       "header does not have it")
            self._where[name] = f

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def file_of(self, name: str) -> Path:
        return self._where[name].path

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name].entries[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self._where[name].entries[name][0]

    def read(self, name: str, region: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
        """The tensor, or its `region` (one (start, stop) per axis), as a fresh numpy array."""
        a = self._where[name].array(name)
        if region is None:
            return np.array(a)
        if len(region) != a.ndim:
            raise ValueError(f"tensor {name!r}: region {region} does not match rank {a.ndim}")
        return np.array(a[tuple(slice(lo, hi) for lo, hi in region)])

    def close(self):
        for f in set(self._where.values()):
            f.close()


# ---- writing --------------------------------------------------------------------------------
def _header_bytes(specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
                  metadata: dict[str, str] | None) -> bytes:
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, shape, dtype in specs:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": dtype_name(dtype), "shape": list(shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data buffer 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_file(path: str | os.PathLike, specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
               arrays: Iterable[np.ndarray], metadata: dict[str, str] | None = None,
               after_each: Callable[[], None] | None = None) -> None:
    """Write one file whose tensors are declared up front (`specs`: name, shape, dtype) and then
    streamed (`arrays`, same order), so only one tensor is in memory at a time. The file appears
    under its name only once complete (written to a temporary name, then renamed).
    `after_each()` is called once each tensor is written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(_header_bytes(specs, metadata))
        for (name, shape, dtype), a in zip(specs, arrays, strict=True):
            a = np.asarray(a)
            if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
                raise SafetensorsError(f"{path}: tensor {name!r} declared {dtype}{list(shape)} "
                                       f"but got {a.dtype}{list(a.shape)}")
            f.write(np.ascontiguousarray(a).tobytes())
            if after_each is not None:
                after_each()
    os.replace(tmp, path)


def plan_shards(specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
                max_shard_bytes: int) -> list[list[int]]:
    """Split tensors, in order, into files of at most `max_shard_bytes` (a single tensor larger
    than that gets a file of its own). Returns the spec indices of each file."""
    files: list[list[int]] = [[]]
    size = 0
    for i, (_, shape, dtype) in enumerate(specs):
        n = math.prod(shape) * np.dtype(dtype).itemsize
        if files[-1] and size + n > max_shard_bytes:
            files.append([])
            size = 0
        files[-1].append(i)
        size += n
    return files


def write_sharded(directory: str | os.PathLike,
                  specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
                  arrays: Iterator[np.ndarray], max_shard_bytes: int,
                  metadata: dict[str, str] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Write `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json`
    (written last, so a directory with an index is complete). `arrays` yields the tensors in
    `specs` order. progress(done, total) follows each tensor written. Returns the file names."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups = plan_shards(specs, max_shard_bytes)
    n = len(groups)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    arrays = iter(arrays)
    weight_map, total, done = {}, 0, [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], len(specs))

    for fname, group in zip(names, groups):
        file_specs = [specs[i] for i in group]
        write_file(directory / fname, file_specs, (next(arrays) for _ in group),
                   {"format": "pt", **(metadata or {})}, after_each=tick)
        for name, shape, dtype in file_specs:
            weight_map[name] = fname
            total += math.prod(shape) * np.dtype(dtype).itemsize
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    tmp = directory / (INDEX_NAME + ".partial")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, directory / INDEX_NAME)
    return names
