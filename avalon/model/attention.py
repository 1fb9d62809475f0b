"""Grouped-query causal attention (`*` layers), as HF NemotronH: no positional encoding (NoPE),
no biases, no q/k norm; scores scaled by head_dim^-0.5, softmax in fp32. The Llama/Qwen
families add, in HF's order: q/k/v biases (`attention_qkv_bias`), a per-head RMSNorm of q and k
(`qk_norm`, Qwen3), rotary embedding of q and k at each token's position (`rope.py`), and an
o bias (`attention_out_bias`). The cache holds rotated keys.

Same mixer contract as Mamba-2: `attention(p, x, cfg, segment_ids=, cache=, lengths=, num_new=)`
-> (y, new_cache). Packed rows attend only within their own segment. The KV cache is head-major,
[b, kv_heads, capacity, head_dim] (the layout that reaches ~72% of copy bandwidth in decode on an
H200; token-major reached 27%). With a cache, the new tokens of row b sit at positions
lengths[b] + i (i < num_new[b]); positions past the capacity are dropped, never wrapped.

Paged KV (the engine's decode layout): `PagedKV` is a pool of pages [pages, kv_heads,
page_size, head_dim] shared by all slots, and `pages` [b, W] lists each row's pages in order
(position p of row b lives at page pages[b, p // page_size], offset p % page_size; entries
>= the pool size are unallocated). Memory then follows the tokens held, not slots x the longest
context. Attention over pages is an online softmax over blocks of pages (`_paged_attention`), so
its memory is bounded by rows x queries x block, whatever the context. The contiguous
`KVCache` path is the readable reference it is tested against. Under a mesh whose rules split
the pool's pages (`kv_pages`, the engine's decode rules), each device writes and attends over
the pages it holds and the partial softmaxes are merged (`_paged_sharded`).

Notation: b batch, q/k query/key positions, h kv heads, g query heads per kv head, d head dim,
n pool pages, s page size, w pages per row.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec

from avalon import sharding
from avalon.model.attention_scan import causal_scan_attention
from avalon.model.config import AttentionImpl, ModelConfig
from avalon.model.dense import dense
from avalon.model.norms import rms_norm
from avalon.model.ops import PLAIN, Ops
from avalon.model.rope import apply_rope, segment_positions
from avalon.sharding import constrain

_MASKED = -1e30


@struct.dataclass
class KVCache:
    k: jax.Array  # [b, kv_heads, capacity, head_dim]
    v: jax.Array  # [b, kv_heads, capacity, head_dim]


KV_CACHE_AXES = KVCache(k=("batch", "act_kv_heads", "cache_seq", None),
                        v=("batch", "act_kv_heads", "cache_seq", None))


@struct.dataclass
class PagedKV:
    k: jax.Array  # [pages, kv_heads, page_size, head_dim]
    v: jax.Array  # [pages, kv_heads, page_size, head_dim]


# Pages are split over `kv_pages` (in decode: every chip of the engine's mesh), heads are not:
# GQA models have too few KV heads to split (Super: 2 over a host's 4 chips), and a chip holding
# whole pages attends over them on its own (`_paged_sharded`).
PAGED_KV_AXES = PagedKV(k=("kv_pages", None, None, None), v=("kv_pages", None, None, None))
# Pages per block of the online softmax: the scores of one block are
# [rows, heads, queries, PAGE_BLOCK * page_size] fp32.
PAGE_BLOCK = 16
# Queries per block of the FLASH full-sequence path (its scores: [b, h, g, FLASH_BLOCK, <= t]).
# 64, not 128: vs_torch's 13.6M Nemotron-H's attention layer (8 x 512 tokens, head_dim 32, fwd +
# bwd, one CPU core) took 0.91-0.96x the time (blocks of 32: 0.93x, of 256: 1.08x); smaller blocks
# skip more of the masked upper triangle and keep each block's fp32 scores in cache.
FLASH_BLOCK = 64

def init_paged_kv(cfg: ModelConfig, num_pages: int, page_size: int, stored=None) -> PagedKV:
    """A zero pool of `stored` dtype: the values' dtype (None: cfg's), or an unsigned integer of
    the same width holding their bit patterns (a caller's choice: some platforms move 16-bit
    floats faster as bits); reads and writes follow the pool's own dtype (`to_storage`,
    `from_storage`). Zero bits are +0.0."""
    shape = (num_pages, cfg.num_key_value_heads, page_size, cfg.head_dim)
    stored = cfg.jnp_dtype if stored is None else stored
    return PagedKV(k=jnp.zeros(shape, stored), v=jnp.zeros(shape, stored))


def to_storage(values: jax.Array, dtype, stored) -> jax.Array:
    """`values` cast to `dtype`, as a pool of dtype `stored` (dtype itself, or an unsigned
    integer of its width) holds them: a bitcast between types of one width is exact."""
    values = values.astype(dtype)
    stored = jnp.dtype(stored)
    return values if stored == values.dtype else jax.lax.bitcast_convert_type(values, stored)


def from_storage(stored: jax.Array, dtype) -> jax.Array:
    """`to_storage`'s inverse: stored contents as `dtype` values."""
    dtype = jnp.dtype(dtype)
    return stored if stored.dtype == dtype else jax.lax.bitcast_convert_type(stored, dtype)


def init_kv_cache(cfg: ModelConfig, batch: int, capacity: int) -> KVCache:
    shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
    return KVCache(k=jnp.zeros(shape, cfg.jnp_dtype), v=jnp.zeros(shape, cfg.jnp_dtype))


def _scores_to_out(q, k, v, mask, scale):
    """q [b, Q, h, g, d]; k, v [b, h, K, d]; mask broadcastable to [b, h, g, Q, K]."""
    s = jnp.einsum("bqhgd,bhkd->bhgqk", q, k) * jnp.asarray(scale, q.dtype)
    # A large finite fill, not -inf: a fully masked row (a padding query) then stays finite in
    # both passes; with -inf its NaNs would leak into dK/dV through the softmax VJP.
    s = jnp.where(mask, s.astype(jnp.float32), _MASKED)
    probs = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhgqk,bhkd->bqhgd", probs, v)


def _heads_parallel(q, k, v, segment_ids, cfg: ModelConfig, scale, ops: Ops = PLAIN):
    """`_full_attention` under the active rules as a `shard_map` over the query heads' mesh
    axes (`act_heads`): each chip runs its whole rows and its query heads with the one or
    more kv heads they read, sliced from the (small, unsplit) k and v. None when no rules
    are active, the heads are not split, the rows are (`mixer_seq`), or a chip's heads do
    not fall on whole kv-head groups.

    Why: under sequence parallelism the partitioner left the block scan's tensors (the
    output's cotangent, the log-sum-exp) split along the block axis, so every one of the
    pod's 8,256 block pairs all-gathered a whole [128 blocks, ..] query-sized tensor (1 GB)
    in the backward: 4.5 PB per update step per chip. Inside the shard_map there is nothing
    left to partition."""
    active = sharding.active()
    if active is None:
        return None
    mesh, rules = active
    b, t, nkv, g, hd = q.shape
    nh = nkv * g
    spec = sharding.logical_to_spec(("batch", "mixer_seq", "act_heads", None), rules, mesh,
                                    (b, t, nh, hd))
    spec = tuple(spec) + (None,) * (4 - len(spec))
    heads = () if spec[2] is None else (spec[2],) if isinstance(spec[2], str) else spec[2]
    if not heads or spec[1] is not None:
        return None
    local = nh // math.prod(mesh.shape[a] for a in heads)
    if g % local and local % g:
        return None
    kv_local = max(local // g, 1)
    rows = PartitionSpec(spec[0], None, None, None)
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids

    def per_chip(q, k, v, seg):
        # The chip's place along the head axes, then the first kv head its query heads read.
        first = jax.lax.axis_index(heads) * local // g
        kl = jax.lax.dynamic_slice_in_dim(k, first, kv_local, axis=2)
        vl = jax.lax.dynamic_slice_in_dim(v, first, kv_local, axis=2)
        ql = q.reshape(q.shape[0], t, kv_local, local // kv_local, hd)
        return _full_attention(ql, kl, vl, seg, cfg, scale, ops).reshape(q.shape)

    out = jax.shard_map(per_chip, mesh=mesh,
                        in_specs=(PartitionSpec(*spec), rows, rows, PartitionSpec(spec[0])),
                        out_specs=PartitionSpec(*spec), check_vma=False)(
        q.reshape(b, t, nh, hd), k, v, seg)
    return out.reshape(b, t, nkv, g, hd)


def _full_attention(q, k, v, segment_ids, cfg: ModelConfig, scale, ops: Ops = PLAIN):
    """No cache: causal (and same-segment) attention over the sequence itself. FLASH runs on
    the platform's fused core where one is given (`Ops.attention`)."""
    b, t = q.shape[:2]
    kt, vt = k.swapaxes(1, 2), v.swapaxes(1, 2)  # [b, h, t, d]
    pos = jnp.arange(t)
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids

    def block(q_blk, q_pos, q_seg):
        causal = q_pos[:, None] >= pos[None, :]  # [Q, K]
        same = q_seg[:, :, None] == seg[:, None, :]  # [b, Q, K]
        mask = (causal[None] & same)[:, None, None]  # [b, 1, 1, Q, K]
        return _scores_to_out(q_blk, kt, vt, mask, scale)

    chunk = cfg.attention_query_chunk
    if cfg.attention_impl == AttentionImpl.FLASH:
        if ops.attention is not None:
            return _fused_attention(ops.attention, q, k, v, seg, scale)
        return _flash_attention(q, k, v, seg, scale, FLASH_BLOCK)
    if cfg.attention_impl == AttentionImpl.CAUSAL_SCAN:
        return causal_scan_attention(q, k, v, seg, scale, chunk)
    if cfg.attention_impl == AttentionImpl.NAIVE or t <= chunk:
        return block(q, pos, seg)
    if cfg.attention_impl == AttentionImpl.BLOCK_CAUSAL:
        # Query chunk i only reads keys [0, end of chunk i]: the blocks above the causal
        # diagonal, all masked, are never computed (about half the FLOPs of NAIVE).
        outs = []
        for lo in range(0, t, chunk):
            hi = min(lo + chunk, t)
            causal = pos[lo:hi, None] >= pos[None, :hi]
            same = seg[:, lo:hi, None] == seg[:, None, :hi]
            mask = (causal[None] & same)[:, None, None]
            outs.append(_scores_to_out(q[:, lo:hi], kt[:, :, :hi], vt[:, :, :hi], mask, scale))
        return jnp.concatenate(outs, axis=1)
    # Query-chunked: scores for one chunk of queries at a time (memory O(t * chunk)).
    pad = (-t) % chunk
    qp = jnp.pad(q, [(0, 0), (0, pad)] + [(0, 0)] * 3)
    n = (t + pad) // chunk
    q_chunks = qp.reshape(b, n, chunk, *q.shape[2:]).swapaxes(0, 1)
    pos_chunks = jnp.arange(t + pad).reshape(n, chunk)
    seg_chunks = jnp.pad(seg, [(0, 0), (0, pad)], constant_values=-1).reshape(b, n, chunk)
    out = jax.lax.map(lambda a: jax.checkpoint(block)(*a),
                      (q_chunks, pos_chunks, seg_chunks.swapaxes(0, 1)))
    return out.swapaxes(0, 1).reshape(b, t + pad, *q.shape[2:])[:, :t]


def _block_scores(q_blk, k_vis, seg_q, seg_k, lo: int, g: int, scale):
    """Masked fp32 scores of query rows [lo * g, hi * g) (row m: query lo + m // g, group head
    m % g) against the keys they can see, [0, hi): q_blk [b, h, Q*g, d]; k_vis [b, h, hi, d];
    seg_q [b, Q]; seg_k [b, hi] -> [b, h, Q*g, hi]."""
    s = jnp.einsum("bhmd,bhkd->bhmk", q_blk, k_vis) * jnp.asarray(scale, q_blk.dtype)
    rows = q_blk.shape[2]
    q_pos = lo + jnp.arange(rows) // g
    causal = q_pos[:, None] >= jnp.arange(k_vis.shape[2])[None, :]  # [Q*g, hi]
    same = jnp.repeat(seg_q, g, axis=1)[:, :, None] == seg_k[:, None, :]  # [b, Q*g, hi]
    return jnp.where((causal[None] & same)[:, None], s.astype(jnp.float32), _MASKED)


def _query_blocks(t: int, block: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + block, t)) for lo in range(0, t, block)]


def _flash_attention(q, k, v, seg, scale, block: int):
    """Causal, same-segment attention one block of `block` queries at a time, each against
    only the keys at or before its last query (block-causal: the blocks above the diagonal
    are never computed). q [b, t, h, g, d]; k, v [b, t, h, d]; seg [b, t] -> [b, t, h, g, d].

    Memory: one block's scores [b, h, g * block, <= t] fp32 at a time, never [t, t]. Heads
    lead and each kv head's g query heads are rows of one matrix, so every product is a plain
    batched matmul over (b, h). The custom VJP keeps only the output and the rows' log-sum-exp
    and recomputes each block's probabilities in the backward (FlashAttention's backward, per
    query block). `_scores_to_out` is the reference."""
    b, t, h, g, d = q.shape
    qh = q.transpose(0, 2, 1, 3, 4).reshape(b, h, t * g, d)
    out = _flash_core(qh, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), seg, scale, g,
                      block)
    return out.reshape(b, h, t, g, d).transpose(0, 2, 1, 3, 4)


def _fused_attention(core, q, k, v, seg, scale):
    """`_flash_attention` computed by a platform's fused core (`Ops.attention`)."""
    b, t, h, g, d = q.shape
    qh = q.transpose(0, 2, 1, 3, 4).reshape(b, h, t * g, d)
    out = core(qh, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), seg.astype(jnp.int32),
               scale, g)
    return out.reshape(b, h, t, g, d).transpose(0, 2, 1, 3, 4)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash_core(q, k, v, seg, scale, g: int, block: int):
    """q [b, h, t*g, d]; k, v [b, h, t, d]; seg [b, t] -> [b, h, t*g, d]."""
    return _flash_fwd(q, k, v, seg, scale, g, block)[0]


def _flash_fwd(q, k, v, seg, scale, g, block):
    outs, lses = [], []
    for lo, hi in _query_blocks(k.shape[2], block):
        s = _block_scores(q[:, :, lo * g:hi * g], k[:, :, :hi], seg[:, lo:hi], seg[:, :hi], lo,
                          g, scale)
        m = s.max(axis=-1, keepdims=True)
        p = jnp.exp(s - m)  # masked entries underflow to exactly 0
        denom = p.sum(axis=-1, keepdims=True)
        # Normalise the [rows, d] output, not the [rows, keys] probabilities.
        pv = jnp.einsum("bhmk,bhkd->bhmd", p.astype(v.dtype), v[:, :, :hi]).astype(jnp.float32)
        outs.append((pv / denom).astype(v.dtype))
        lses.append((m + jnp.log(denom))[..., 0])
    out = jnp.concatenate(outs, axis=2)
    return out, (q, k, v, seg, out, jnp.concatenate(lses, axis=-1))


def _flash_bwd(scale, g, block, res, do):
    q, k, v, seg, out, lse = res  # lse [b, h, t*g]
    f32 = jnp.float32
    # D_m = sum_d dO_m * O_m, so that dS = P * (dP - D) (the softmax VJP per row).
    d_row = jnp.sum(do.astype(f32) * out.astype(f32), axis=-1)
    dk = jnp.zeros(k.shape, f32)
    dv = jnp.zeros(v.shape, f32)
    dqs = []
    for lo, hi in _query_blocks(k.shape[2], block):
        rows = slice(lo * g, hi * g)
        q_i, do_i = q[:, :, rows], do[:, :, rows]
        s = _block_scores(q_i, k[:, :, :hi], seg[:, lo:hi], seg[:, :hi], lo, g, scale)
        p = jnp.exp(s - lse[:, :, rows, None])
        dv = dv.at[:, :, :hi].add(
            jnp.einsum("bhmk,bhmd->bhkd", p.astype(do.dtype), do_i).astype(f32))
        dp = jnp.einsum("bhmd,bhkd->bhmk", do_i, v[:, :, :hi]).astype(f32)
        ds = (p * (dp - d_row[:, :, rows, None]) * scale).astype(q.dtype)
        dqs.append(jnp.einsum("bhmk,bhkd->bhmd", ds, k[:, :, :hi]))
        dk = dk.at[:, :, :hi].add(jnp.einsum("bhmk,bhmd->bhkd", ds, q_i).astype(f32))
    return (jnp.concatenate(dqs, axis=2), dk.astype(k.dtype), dv.astype(v.dtype), None)


_flash_core.defvjp(_flash_fwd, _flash_bwd)


def _write_cache(cache_arr, new, start, num_new):
    """cache_arr [b, h, C, d]; new [b, t, h, d] written at start[b] + i for i < num_new[b]."""
    cap = cache_arr.shape[2]
    t = new.shape[1]
    pos = start[:, None] + jnp.arange(t)[None, :]
    if num_new is not None:
        pos = jnp.where(jnp.arange(t)[None, :] < num_new[:, None], pos, cap)
    pos = jnp.where(pos < cap, pos, cap)  # out of range -> dropped below

    def one(c, n, p):
        return c.at[:, p].set(n.swapaxes(0, 1).astype(c.dtype), mode="drop")

    return jax.vmap(one)(cache_arr, new, pos)


def _write_pages(pool: jax.Array, new: jax.Array, pages, start, num_new, kv_dtype,
                 windows: bool = False):
    """pool [n, h, s, d] (`kv_dtype` values, or their bits: `init_paged_kv`); new [b, t, h, d]
    written at position start[b] + i (i < num_new[b]) through the page table pages [b, w];
    positions past the row's pages are dropped.

    Whole pages are read, updated and written back (the m <= (t + s - 2) // s + 1 pages the row's
    new tokens fall in), never single [h, d] windows: a scatter into one page offset made the TPU
    compiler lay the pool out offset-major inside the decode loop and copy the whole pool in and out
    of it (a pool-sized temporary). With `windows` (`Ops.kv_window_writes`) each token's
    [h, d] window is written in place instead (`_write_windows`)."""
    if windows:
        return _write_windows(pool, new, pages, start, num_new, kv_dtype)
    return _write_whole_pages(pool, new, pages, start, num_new, kv_dtype)


def _write_whole_pages(pool: jax.Array, new: jax.Array, pages, start, num_new, kv_dtype):
    """`_write_pages` by whole pages (see there)."""
    n, _, size, _ = pool.shape
    b, t = new.shape[:2]
    w = pages.shape[1]
    m = (t + size - 2) // size + 1
    nn = jnp.full((b,), t, jnp.int32) if num_new is None else num_new
    col = start[:, None] // size + jnp.arange(m)[None, :]  # [b, m] table columns touched
    pid = jnp.take_along_axis(pages, jnp.clip(col, 0, w - 1), axis=1)
    pid = jnp.where(col < w, pid, n)
    # Token i of the row lands at block position (page mm, offset o) = start + i.
    pos = col[:, :, None] * size + jnp.arange(size)[None, None, :]  # [b, m, s]
    i = pos - start[:, None, None]
    hit = (i >= 0) & (i < nn[:, None, None]) & (i < t)
    src = jnp.take_along_axis(new, jnp.clip(i, 0, t - 1).reshape(b, m * size, 1, 1), axis=1)
    src = src.reshape(b, m, size, *new.shape[2:]).swapaxes(2, 3)  # [b, m, h, s, d]
    pid = jnp.where(hit.any(axis=-1), pid, n)  # pages without a new token: not written
    cur = jnp.take(pool, pid, axis=0, mode="fill", fill_value=0)  # [b, m, h, s, d]
    upd = jnp.where(hit[:, :, None, :, None], to_storage(src, kv_dtype, pool.dtype), cur)
    # The updated pages are made before the scatter, not fused into it: a scatter whose
    # updates read its own operand cannot run in place, and XLA:GPU copied the whole pool
    # before every write (one pool-sized temporary per layer; RESULTS.md, "One H200 on paper").
    upd = jax.lax.optimization_barrier(upd)
    return pool.at[pid].set(upd, mode="drop")


def _write_windows(pool: jax.Array, new: jax.Array, pages, start, num_new, kv_dtype):
    """`_write_pages` as one scatter of each new token's [h, d] window to its (page, offset),
    in place, touching only those windows (the whole-page merge gathers, merges and writes back
    every page a token falls in)."""
    n, _, size, _ = pool.shape
    b, t = new.shape[:2]
    w = pages.shape[1]
    nn = jnp.full((b,), t, jnp.int32) if num_new is None else num_new
    pos = start[:, None] + jnp.arange(t)[None, :]  # [b, t]
    col = pos // size
    pid = jnp.take_along_axis(pages, jnp.clip(col, 0, w - 1), axis=1)
    keep = (jnp.arange(t)[None, :] < nn[:, None]) & (col < w)
    pid = jnp.where(keep, pid, n)  # not written (dropped)
    # pool[pid, :, offset] is [b, t, h, d]: the advanced indices' axes lead.
    return pool.at[pid, :, pos % size].set(to_storage(new, kv_dtype, pool.dtype),
                                           mode="drop")


def _paged_partial(q, pool: PagedKV, pages, page_index, q_pos, scale, kv_dtype):
    """The unnormalised online softmax of q over the pages in `pages` [b, w] (column i holds
    the row's page number page_index[i], i.e. positions page_index[i] * page_size + o; the
    pool holds `kv_dtype` values or their bits): returns (m, l, acc)
    [b, h, g, Q] x2 and [b, h, g, Q, d], fp32.

    Blocks of PAGE_BLOCK pages (a running max m, normaliser l and unnormalised output acc,
    rescaled as each block raises the max): memory is one block's scores, whatever the
    context. The loop stops after the last block any query can see (the table's columns are in
    position order), so its cost follows the longest row of the call, not the table's width
    (a bucket up to 4x wider); a skipped block is wholly masked for every query and would
    leave (m, l, acc) exactly as they are."""
    b, nq, h, g, d = q.shape
    w = pages.shape[1]
    size = pool.k.shape[2]
    per = min(PAGE_BLOCK, w)
    if w % per:
        raise ValueError(f"paged attention: page table width {w} is not a multiple of the "
                         f"block of {per} pages")
    blocks = pages.reshape(b, w // per, per).swapaxes(0, 1)  # [w / per, b, per]
    first = page_index.reshape(w // per, per) * size  # [w / per, per] first position of a page
    f32 = jnp.float32

    def block(carry, xs):
        m, l, acc = carry
        idx, start = xs

        def gather(a):  # [b, per, h, s, d] -> [b, h, per * s, d]
            a = from_storage(jnp.take(a, idx, axis=0, mode="fill", fill_value=0), kv_dtype)
            return a.swapaxes(1, 2).reshape(b, h, per * size, d)

        k, v = gather(pool.k), gather(pool.v)
        k_pos = (start[:, None] + jnp.arange(size)[None, :]).reshape(per * size)
        mask = (k_pos[None, None, :] <= q_pos[:, :, None])[:, None, None]  # [b, 1, 1, Q, K]
        s = (jnp.einsum("bqhgd,bhkd->bhgqk", q, k) * jnp.asarray(scale, q.dtype)).astype(f32)
        s = jnp.where(mask, s, _MASKED)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(axis=-1)
        pv = jnp.einsum("bhgqk,bhkd->bhgqd", p.astype(v.dtype), v).astype(f32)
        return (m_new, l, acc * corr[..., None] + pv), None

    init = (jnp.full((b, h, g, nq), _MASKED, f32), jnp.zeros((b, h, g, nq), f32),
            jnp.zeros((b, h, g, nq, d), f32))
    live = jnp.sum(first[:, 0] <= jnp.max(q_pos))  # blocks some query sees: a prefix

    def step(carry):
        i, *state = carry
        xs = (jax.lax.dynamic_index_in_dim(blocks, i, 0, keepdims=False),
              jax.lax.dynamic_index_in_dim(first, i, 0, keepdims=False))
        return (i + 1, *block(tuple(state), xs)[0])

    _, *out = jax.lax.while_loop(lambda c: c[0] < live, step, (jnp.int32(0), *init))
    return tuple(out)


def _normalise(l, acc, dtype):
    """[b, h, g, Q(, d)] -> [b, Q, h, g, d]. A query with nothing visible (a padding row) has
    l = 0: keep it finite."""
    out = acc / jnp.maximum(l, jnp.finfo(jnp.float32).tiny)[..., None]
    return out.transpose(0, 3, 1, 2, 4).astype(dtype)


def _paged_attention(q, pool: PagedKV, pages, q_pos, scale, kv_dtype):
    """q [b, Q, h, g, d]; pages [b, w]; q_pos [b, Q]: query i of row b sees positions <= q_pos.
    Online softmax over blocks of pages (`_paged_partial`). Returns [b, Q, h, g, d]."""
    _, l, acc = _paged_partial(q, pool, pages, jnp.arange(pages.shape[1]), q_pos, scale,
                               kv_dtype)
    return _normalise(l, acc, q.dtype)


def pool_split(num_pages: int):
    """(mesh, mesh axes) the KV pool's pages are split over under the active rules (logical
    axis `kv_pages`), or None when the pool is whole on every device."""
    active = sharding.active()
    if active is None:
        return None
    mesh, rules = active
    spec = sharding.logical_to_spec(("kv_pages",), rules, mesh, (num_pages,))
    if not spec:
        return None
    axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
    return mesh, axes


def _paged_sharded(q, k_new, v_new, pool: PagedKV, pages, lengths, num_new, scale, kv_dtype,
                   mesh, axes, windows: bool = False):
    """Paged attention with the pool split by pages over mesh `axes` in blocks (chip c holds
    pages [c n / P, (c + 1) n / P)), as the engine lays it out: page j of every row lives on
    chip j % P (`inference/pages.py`). Each chip writes the new K/V that fall in its pages and
    runs the online softmax over its own table columns j = c, c + P, ..., and the chips'
    partial softmaxes are merged (max, then rescaled sums over `axes`): what crosses chips is
    [b, h, g, Q, d] per layer, never KV. q, k_new, v_new, pages and lengths are taken whole
    (small). Returns (new pool, out [b, Q, h, g, d])."""
    n = pool.k.shape[0]
    b, w = pages.shape
    shards = math.prod(mesh.shape[a] for a in axes)
    if w % shards:
        raise ValueError(f"paged attention: page table width {w} is not a multiple of the "
                         f"{shards} chips the pool is split over")
    per_chip = n // shards
    t = q.shape[1]
    nn = jnp.full((b,), t, jnp.int32) if num_new is None else num_new

    def body(q, k_new, v_new, pk, pv, pages, lengths, nn):
        c = jax.lax.axis_index(axes)
        local = pages - c * per_chip
        local = jnp.where((local >= 0) & (local < per_chip), local, per_chip)  # else: dropped
        pk = _write_pages(pk, k_new, local, lengths, nn, kv_dtype, windows)
        pv = _write_pages(pv, v_new, local, lengths, nn, kv_dtype, windows)
        mine = jnp.take(local.reshape(b, w // shards, shards), c, axis=2)
        page_index = jnp.arange(w // shards) * shards + c
        q_pos = lengths[:, None] + jnp.arange(t)[None, :]
        m, l, acc = _paged_partial(q, PagedKV(k=pk, v=pv), mine, page_index, q_pos, scale,
                                   kv_dtype)
        m_all = jax.lax.pmax(m, axes)
        corr = jnp.exp(m - m_all)
        l = jax.lax.psum(l * corr, axes)
        acc = jax.lax.psum(acc * corr[..., None], axes)
        return pk, pv, _normalise(l, acc, q.dtype)

    whole, split = PartitionSpec(), PartitionSpec(axes)
    pk, pv, out = jax.shard_map(
        body, mesh=mesh, in_specs=(whole, whole, whole, split, split, whole, whole, whole),
        out_specs=(split, split, whole), check_vma=False)(
            q, k_new, v_new, pool.k, pool.v, pages, lengths, nn)
    return PagedKV(k=pk, v=pv), out


def attention(p: dict, x: jax.Array, cfg: ModelConfig, *, segment_ids=None,
              cache: KVCache | PagedKV | None = None, lengths=None, num_new=None, pages=None,
              ops: Ops = PLAIN):
    b, t, _ = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = nh // nkv
    dtype = x.dtype
    q = dense(x, p["q"].astype(dtype), ops=ops)
    k = dense(x, p["k"].astype(dtype), ops=ops)
    v = dense(x, p["v"].astype(dtype), ops=ops)
    q, k, v = _position_and_norm(p, q, k, v, cfg, segment_ids, lengths, ops)
    if cache is None:
        # Computed on the residual stream's positions, then switched by all-to-all (as
        # mamba2._at_residual_split: no all-gather of the layer input to whole rows).
        q = constrain(q, ("batch", "act_seq", "act_mixer_out", None))
        k = constrain(k, ("batch", "act_seq", "act_mixer_out", None))
        v = constrain(v, ("batch", "act_seq", "act_mixer_out", None))
    # Whole rows, heads split ("mixer_seq": under sequence parallelism an all-to-all from the
    # residual stream's position split; the same layout as before without it).
    q = constrain(q, ("batch", "mixer_seq", "act_heads", None))
    k = constrain(k, ("batch", "mixer_seq", "act_kv_heads", None))
    v = constrain(v, ("batch", "mixer_seq", "act_kv_heads", None))
    q = q.reshape(b, t, nkv, g, hd)  # query head h*g + j reads kv head h (HF repeat_kv order)
    scale = hd ** -0.5

    if cache is None:
        out = _heads_parallel(q, k, v, segment_ids, cfg, scale, ops)
        if out is None:
            out = _full_attention(q, k, v, segment_ids, cfg, scale, ops)
        new_cache = None
    elif isinstance(cache, PagedKV):
        if pages is None:
            raise ValueError("attention: a PagedKV cache needs its page table (pages=)")
        split = pool_split(cache.k.shape[0])
        if split is not None:
            new_cache, out = _paged_sharded(q, k, v, cache, pages, lengths, num_new, scale,
                                            cfg.jnp_dtype, *split, ops.kv_window_writes)
        else:
            new_cache = PagedKV(
                k=_write_pages(cache.k, k, pages, lengths, num_new, cfg.jnp_dtype,
                               ops.kv_window_writes),
                v=_write_pages(cache.v, v, pages, lengths, num_new, cfg.jnp_dtype,
                               ops.kv_window_writes))
            q_pos = lengths[:, None] + jnp.arange(t)[None, :]
            out = _paged_attention(q, new_cache, pages, q_pos, scale, cfg.jnp_dtype)
    else:
        new_cache = KVCache(k=_write_cache(cache.k, k, lengths, num_new),
                            v=_write_cache(cache.v, v, lengths, num_new))
        cap = cache.k.shape[2]
        q_pos = lengths[:, None] + jnp.arange(t)[None, :]  # [b, Q]
        mask = jnp.arange(cap)[None, None, :] <= q_pos[:, :, None]  # [b, Q, K]
        out = _scores_to_out(q, new_cache.k, new_cache.v, mask[:, None, None], scale)

    out = out.reshape(b, t, nh, hd)
    if cache is None:  # back to the residual stream's position split before the o projection
        out = constrain(out, ("batch", "act_seq", "act_mixer_out", None))
    y = dense(out, p["o"].astype(dtype), 2, ops)
    if "o_bias" in p:
        y = y + p["o_bias"].astype(dtype)
    return y, new_cache


def _position_and_norm(p: dict, q, k, v, cfg: ModelConfig, segment_ids, lengths,
                       ops: Ops = PLAIN):
    """The Llama/Qwen steps between the projections and the scores (identity for Nemotron-H):
    biases, q/k RMSNorm over head_dim, rotary embedding. q [b, t, nh, hd]; k, v [b, t, nkv, hd];
    with a cache the rows continue at `lengths`, without one at their segments' starts."""
    dtype = q.dtype
    if "q_bias" in p:
        q = q + p["q_bias"].astype(dtype)
        k = k + p["k_bias"].astype(dtype)
        v = v + p["v_bias"].astype(dtype)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.layer_norm_epsilon, ops)
        k = rms_norm(k, p["k_norm"], cfg.layer_norm_epsilon, ops)
    if cfg.rope_theta is not None:
        b, t = q.shape[:2]
        if lengths is None:  # positions within the row: each < t
            pos, bound = segment_positions(segment_ids, b, t), t
        else:
            pos = lengths[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)[None, :]
            bound = None
        q, k = apply_rope(q, pos, cfg, bound=bound), apply_rope(k, pos, cfg, bound=bound)
    return q, k, v
