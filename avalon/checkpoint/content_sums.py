"""Content checksums of sharded arrays that do not depend on how the arrays are sharded.

An array's bytes are read as words w_i (the element's own width: 1, 2, 4 or 8 bytes; wider
elements as several 8-byte words) with global word index i in row-major order, and its sum is

    (S0, S1) = (sum_i w_i, sum_i i * w_i)  mod 2**64.

Each process sums the shards it holds (one replica of each), so the same value comes out of
any mesh: the checkpoint written on a 2x4 mesh is verified when restored onto 1x2. A single
flipped bit changes S0 by +-2**k, never 0 mod 2**64, so it is always detected; S1 (index
weighted) also catches moved or swapped words. This is corruption detection, not a
cryptographic digest: nobody forges a checkpoint to pass it.
Cost: `experiments/bench/checkpoint_sums.py` (RESULTS.md: about as fast as sha256).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

_CHUNK = 1 << 20  # words per numpy pass: bounds the temporaries (~8 MB each)
_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _words(data: np.ndarray) -> tuple[np.ndarray, int]:
    """The array's bytes as unsigned words of its element width, shaped (*shape, per)."""
    data = np.ascontiguousarray(data)
    size = data.dtype.itemsize
    width = size if size in _WORD else 8
    if size % width:
        raise ValueError(f"content sums: dtype {data.dtype} is {size} bytes, not a multiple "
                         "of 8")
    per = size // width
    return data.view(_WORD[width]).reshape(*data.shape, per), per


def _shard_sums(data: np.ndarray, starts: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """(S0, S1) of one shard whose element [0, ..., 0] sits at `starts` in the global `shape`.

    The shard is read as rows of a contiguous run of global words: the trailing dimensions
    it spans fully plus the first one it does not (a C-contiguous slab). With off_r the global
    index of row r's first word and j the position in the run,
        S1 = sum_r off_r * rowsum_r + sum_j j * colsum_j,
    so no per-word index array is ever built."""
    words, per = _words(data)
    if data.ndim == 0:
        words, starts, shape = words.reshape(1, per), (0,), (1,)
    dims = words.shape[:-1]
    k = len(shape) - 1  # the run starts at dim k: every dim after it is spanned fully
    while k > 0 and dims[k] == shape[k]:
        k -= 1
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    run = int(np.prod(dims[k:], dtype=np.int64)) * per
    offsets = np.full((1,), starts[k] * strides[k], np.uint64)  # of each row's first element
    for d in range(k - 1, -1, -1):
        axis = (starts[d] + np.arange(dims[d], dtype=np.uint64)) * np.uint64(strides[d])
        offsets = (axis[:, None] + offsets[None, :]).ravel()
    offsets = offsets * np.uint64(per)
    rows = words.reshape(-1, run)
    acc = np.zeros(2, np.uint64)  # arrays wrap mod 2**64 silently (numpy scalars would warn)
    if run <= _CHUNK:
        local = np.arange(run, dtype=np.uint64)
        step = max(1, _CHUNK // run)
        for r in range(0, rows.shape[0], step):
            block = rows[r:r + step].astype(np.uint64)
            row_sums = block.sum(axis=1, dtype=np.uint64)
            col_sums = block.sum(axis=0, dtype=np.uint64)
            acc += np.array([row_sums.sum(dtype=np.uint64),
                             np.dot(offsets[r:r + step], row_sums)], np.uint64)
            acc[1:] += np.dot(local, col_sums)  # an array op: wraps without a warning
        return acc
    local = np.arange(_CHUNK, dtype=np.uint64)
    for r in range(rows.shape[0]):  # rows longer than a chunk: in pieces
        for c in range(0, run, _CHUNK):
            piece = rows[r, c:c + _CHUNK].astype(np.uint64)
            total = piece.sum(dtype=np.uint64)
            acc += np.array([total, np.dot(local[:piece.size], piece)], np.uint64)
            acc[1:] += (offsets[r:r + 1] + np.uint64(c)) * total
    return acc


def _leaf_sums(x) -> np.ndarray:
    """This process's part of (S0, S1) for one leaf (a jax.Array, numpy array or scalar)."""
    if isinstance(x, jax.Array):
        total = np.zeros(2, np.uint64)
        for shard in x.addressable_shards:
            if shard.replica_id != 0:
                continue  # another copy of data some shard already counts
            starts = tuple(s.indices(n)[0] for s, n in zip(shard.index, x.shape))
            total = total + _shard_sums(np.asarray(shard.data), starts, x.shape)
        return total
    if jax.process_index() != 0:
        return np.zeros(2, np.uint64)  # a host value every process holds: counted once
    a = np.asarray(x)
    return _shard_sums(a, (0,) * a.ndim, a.shape)


def content_sums(leaves: list) -> list[str]:
    """One "S0:S1" hex string per leaf, the same on every process and for any sharding."""
    parts = np.stack([_leaf_sums(x) for x in leaves]) if leaves else np.zeros((0, 2), np.uint64)
    if jax.process_count() > 1:
        parts = multihost_utils.process_allgather(parts).sum(axis=0, dtype=np.uint64)
    return [f"{int(a):016x}:{int(b):016x}" for a, b in parts]
