"""Content checksums of sharded arrays that do not depend on how the arrays are sharded.

An array's bytes are read as words w_i (the element's own width: 1, 2, 4 or 8 bytes; wider
elements as several 8-byte words) with global word index i in row-major order, and its sum is

    (S0, H) = (sum_i w_i, sum_i mix(w_i xor i * K))  mod 2**64

with `mix` the SplitMix64 finaliser (a bijection of 64-bit words whose every output bit depends
on every input bit) and K an odd constant (so i * K differs for every i). Both are sums over
(index, word) pairs, so each process sums the shards it holds (one replica of each) and the same
value comes out of any mesh: the checkpoint written on a 2x4 mesh is verified when restored
onto 1x2. A single flipped bit changes S0 by +-2**k, never 0 mod 2**64, so it is always
detected. H catches every other pattern of changes (moved or swapped words, the second
difference +k, -2k, +k that a sum weighted by i or any polynomial in i cannot see, pairs of
top-bit flips) unless the pattern is chosen knowing `mix`: a changed word changes its term to
an unrelated 64-bit value, and the changes cancel with probability 2**-64. This is corruption
detection, not a signature: nothing here is keyed (`mix` is public and invertible), so whoever
can write a checkpoint can write sums that match it, and its meta's digest too
(`train_state.py` states the threat model).
Cost: `experiments/bench/checkpoint_sums.py` (RESULTS.md).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

_CHUNK = 1 << 16  # words per numpy pass: 512 KB buffers, which stay in cache
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


_K = np.uint64(0x9E3779B97F4A7C15)  # odd: i * K is a bijection of word indices mod 2**64
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # SplitMix64
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _lane_sums(w: np.ndarray, z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[sum(w), sum(mix(w xor i * K))] mod 2**64 for uint64 words `w` whose global indices are
    in `z`; `z` and `t` (same shape) are scratch, overwritten. In place, on blocks small enough
    to stay in cache: as fast as the plain sum on one core (RESULTS.md)."""
    np.multiply(z, _K, out=z)
    np.bitwise_xor(z, w, out=z)
    for shift, mult in ((_S30, _M1), (_S27, _M2), (_S31, None)):
        np.right_shift(z, shift, out=t)
        np.bitwise_xor(z, t, out=z)
        if mult is not None:
            np.multiply(z, mult, out=z)
    return np.array([w.sum(dtype=np.uint64), z.sum(dtype=np.uint64)], np.uint64)


def _shard_sums(data: np.ndarray, starts: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """(S0, H) of one shard whose element [0, ..., 0] sits at `starts` in the global `shape`.

    The shard is read as rows of a contiguous run of global words: the trailing dimensions
    it spans fully plus the first one it does not (a C-contiguous slab). Row r's words have the
    global indices off_r + j for j in the run; blocks of at most `_CHUNK` words are summed in
    three preallocated buffers."""
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
    n = min(_CHUNK, max(1, rows.size))
    w_buf, z_buf, t_buf = (np.empty(n, np.uint64) for _ in range(3))
    acc = np.zeros(2, np.uint64)  # arrays wrap mod 2**64 silently (numpy scalars would warn)
    if run <= _CHUNK:
        local = np.arange(run, dtype=np.uint64)
        step = max(1, _CHUNK // run)
        for r in range(0, rows.shape[0], step):
            block = rows[r:r + step]
            w, z, t = (b[:block.size].reshape(block.shape) for b in (w_buf, z_buf, t_buf))
            w[...] = block
            np.add(offsets[r:r + step, None], local[None, :], out=z)
            acc += _lane_sums(w, z, t)
        return acc
    local = np.arange(_CHUNK, dtype=np.uint64)
    for r in range(rows.shape[0]):  # rows longer than a chunk: in pieces
        for c in range(0, run, _CHUNK):
            piece = rows[r, c:c + _CHUNK]
            w, z, t = (b[:piece.size] for b in (w_buf, z_buf, t_buf))
            w[...] = piece
            np.add(local[:piece.size], offsets[r] + np.uint64(c), out=z)
            acc += _lane_sums(w, z, t)
    return acc


def _leaf_sums(x) -> np.ndarray:
    """This process's part of (S0, H) for one leaf (a jax.Array, numpy array or scalar)."""
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
    """One "S0:H" hex string per leaf, the same on every process and for any sharding."""
    parts = np.stack([_leaf_sums(x) for x in leaves]) if leaves else np.zeros((0, 2), np.uint64)
    if jax.process_count() > 1:
        parts = multihost_utils.process_allgather(parts).sum(axis=0, dtype=np.uint64)
    return [f"{int(a):016x}:{int(b):016x}" for a, b in parts]
