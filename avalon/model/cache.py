"""The hybrid decode cache: KV for attention layers, conv + SSM state for Mamba layers.

One pytree, laid out like the params: `cache.blocks[b][f"{j}_{kind}"]` holds the state of the
layer at position j of run b, stacked over the run's repeats (leading axis), then the batch
(slot) axis. `lengths[slot]` counts the tokens already absorbed; attention KV capacity is the
third-from-last axis of every KV leaf and is the same for all attention layers.

Slot helpers (`take_slots`, `put_slots`) move whole per-slot states, e.g. to fork one agent's
context into k rollouts without re-running its prefill.

Paged variant (`init_paged_cache`): attention layers hold a `PagedKV` pool
[repeats, pages, kv_heads, page_size, head_dim] shared by all slots instead of per-slot KV, and
`pages` [b, w] is the page table of the rows a forward runs over (set by the caller, e.g. the
engine's host allocator). Mamba state stays fixed per slot. `take_rows` / `put_rows` move the
per-slot part only; the pool stays where it is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from avalon.model.attention import (
    KV_CACHE_AXES,
    PAGED_KV_AXES,
    KVCache,
    PagedKV,
    init_kv_cache,
    init_paged_kv,
)
from avalon.model.config import LETTERS, ModelConfig
from avalon.model.mamba2 import MAMBA_CACHE_AXES, init_mamba_cache
from avalon.model.params import layer_key


@struct.dataclass
class Cache:
    blocks: list  # per run: {layer_key: MambaCache | KVCache}, each leaf [repeats, b, ...]
    lengths: jax.Array  # [b] int32
    pages: jax.Array | None = None  # [b, w] int32 page table (paged KV only)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int | None:
        """KV capacity (tokens), or None for a model without attention layers."""
        for blk in self.blocks:
            for entry in blk.values():
                if isinstance(entry, KVCache):
                    return entry.k.shape[-2]
        return None

    @property
    def paged(self) -> bool:
        return any(isinstance(e, PagedKV) for blk in self.blocks for e in blk.values())

    @property
    def num_pages(self) -> int | None:
        """Pages in the KV pool, or None for a contiguous cache or a model without attention."""
        for blk in self.blocks:
            for entry in blk.values():
                if isinstance(entry, PagedKV):
                    return entry.k.shape[1]
        return None


def _stack(tree, n: int):
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), tree)


def init_cache(cfg: ModelConfig, batch: int, capacity: int) -> Cache:
    """Zero cache for `batch` slots with `capacity` KV positions per attention layer."""
    blocks = []
    for unit, reps in cfg.blocks:
        entries = {}
        for j, ch in enumerate(unit):
            kind = LETTERS[ch]
            if kind == "mamba":
                entries[layer_key(j, ch)] = _stack(init_mamba_cache(cfg, batch), reps)
            elif kind == "attention":
                entries[layer_key(j, ch)] = _stack(init_kv_cache(cfg, batch, capacity), reps)
        blocks.append(entries)
    return Cache(blocks=blocks, lengths=jnp.zeros((batch,), jnp.int32))


def init_paged_cache(cfg: ModelConfig, batch: int, num_pages: int, page_size: int,
                     stored=None) -> Cache:
    """Zero paged cache: Mamba state for `batch` slots, a pool of `num_pages` KV pages of
    `stored` dtype (`init_paged_kv`; None: cfg's dtype)."""
    blocks = []
    for unit, reps in cfg.blocks:
        entries = {}
        for j, ch in enumerate(unit):
            kind = LETTERS[ch]
            if kind == "mamba":
                entries[layer_key(j, ch)] = _stack(init_mamba_cache(cfg, batch), reps)
            elif kind == "attention":
                entries[layer_key(j, ch)] = _stack(
                    init_paged_kv(cfg, num_pages, page_size, stored), reps)
        blocks.append(entries)
    return Cache(blocks=blocks, lengths=jnp.zeros((batch,), jnp.int32))


def cache_axes(cfg: ModelConfig, paged: bool = False) -> Cache:
    """Logical axes per cache leaf (a `Cache` of tuples), for shardings. (A paged cache's page
    table is an input of each call, not part of the stored state: its axes are left out.)"""
    kv_axes = PAGED_KV_AXES if paged else KV_CACHE_AXES
    blocks = []
    for unit, _ in cfg.blocks:
        entries = {}
        for j, ch in enumerate(unit):
            kind = LETTERS[ch]
            if kind == "mamba":
                entries[layer_key(j, ch)] = jax.tree.map(
                    lambda ax: ("layers", *ax), MAMBA_CACHE_AXES,
                    is_leaf=lambda x: isinstance(x, tuple))
            elif kind == "attention":
                entries[layer_key(j, ch)] = jax.tree.map(
                    lambda ax: ("layers", *ax), kv_axes,
                    is_leaf=lambda x: isinstance(x, tuple))
        blocks.append(entries)
    return Cache(blocks=blocks, lengths=("batch",))


def _per_slot(fn_slot, fn_pool, blocks):
    def one(entry):
        return fn_pool(entry) if isinstance(entry, PagedKV) else jax.tree.map(fn_slot, entry)
    return [{key: one(e) for key, e in blk.items()} for blk in blocks]


def take_rows(cache: Cache, idx: jax.Array, pages: jax.Array) -> Cache:
    """A paged cache over rows idx [r] (entries >= batch are empty padding rows) with page table
    `pages` [r, w]: Mamba state and lengths gathered, the pool shared."""
    take = lambda a: jnp.take(a, idx, axis=1, mode="fill", fill_value=0)
    blocks = _per_slot(take, lambda e: e, cache.blocks)
    return Cache(blocks=blocks, lengths=jnp.take(cache.lengths, idx, mode="fill", fill_value=0),
                 pages=pages)


def put_rows(cache: Cache, idx: jax.Array, part: Cache) -> Cache:
    """Write the rows of `part` (from `take_rows`) back into slots idx (padding dropped); the
    pool becomes part's pool (the one the rows wrote into)."""
    def merge(entry, p):
        if isinstance(entry, PagedKV):
            return p
        return jax.tree.map(lambda a, b: a.at[:, idx].set(b.astype(a.dtype), mode="drop"),
                            entry, p)
    blocks = [{key: merge(e, pblk[key]) for key, e in blk.items()}
              for blk, pblk in zip(cache.blocks, part.blocks)]
    return Cache(blocks=blocks, lengths=cache.lengths.at[idx].set(part.lengths, mode="drop"))


def grow_pool(cache: Cache, num_pages: int, shards: int = 1) -> Cache:
    """A paged cache with `num_pages` pool pages (>= the current count; contents kept). With
    `shards` > 1 the pool is taken as `shards` blocks of pages (one per chip, the engine's
    split pool): each block grows at its end, so a page keeps its chip and local offset."""
    def fix(entry):
        def one(a):
            r, n = a.shape[:2]
            blocks = a.reshape(r, shards, n // shards, *a.shape[2:])
            widths = [(0, 0), (0, 0), (0, (num_pages - n) // shards)] + [(0, 0)] * (a.ndim - 2)
            return jnp.pad(blocks, widths).reshape(r, num_pages, *a.shape[2:])
        return PagedKV(k=one(entry.k), v=one(entry.v))
    blocks = _per_slot(lambda a: a, fix, cache.blocks)
    return Cache(blocks=blocks, lengths=cache.lengths, pages=cache.pages)


def copy_pages(cache: Cache, src: jax.Array, dst: jax.Array) -> Cache:
    """Pool page dst[i] becomes a copy of page src[i] (dst entries >= the pool are dropped)."""
    def fix(entry):
        put = lambda a: a.at[:, dst].set(jnp.take(a, src, axis=1, mode="clip"), mode="drop")
        return PagedKV(k=put(entry.k), v=put(entry.v))
    blocks = _per_slot(lambda a: a, fix, cache.blocks)
    return Cache(blocks=blocks, lengths=cache.lengths, pages=cache.pages)


def take_slots(cache: Cache, idx: jax.Array) -> Cache:
    """The states of slots `idx` [m] as an m-slot cache."""
    blocks = jax.tree.map(lambda a: jnp.take(a, idx, axis=1), cache.blocks)
    return Cache(blocks=blocks, lengths=cache.lengths[idx])


def put_slots(cache: Cache, idx: jax.Array, part: Cache) -> Cache:
    """Write an m-slot `part` into slots `idx` [m] of `cache`."""
    blocks = jax.tree.map(lambda a, p: a.at[:, idx].set(p.astype(a.dtype)), cache.blocks,
                          part.blocks)
    return Cache(blocks=blocks, lengths=cache.lengths.at[idx].set(part.lengths))


def copy_slots(cache: Cache, src: jax.Array, dst: jax.Array) -> Cache:
    """Slot dst[i] becomes a copy of slot src[i] (fork)."""
    return put_slots(cache, dst, take_slots(cache, src))


def resize_kv(cache: Cache, capacity: int) -> Cache:
    """Grow or shrink every attention layer's KV capacity (keeps positions < capacity)."""
    def fix(entry):
        if not isinstance(entry, KVCache):
            return entry
        old = entry.k.shape[-2]
        if capacity >= old:
            pad = [(0, 0)] * (entry.k.ndim - 2) + [(0, capacity - old), (0, 0)]
            return KVCache(k=jnp.pad(entry.k, pad), v=jnp.pad(entry.v, pad))
        return KVCache(k=entry.k[..., :capacity, :], v=entry.v[..., :capacity, :])

    blocks = [{key: fix(e) for key, e in blk.items()} for blk in cache.blocks]
    return Cache(blocks=blocks, lengths=cache.lengths)
