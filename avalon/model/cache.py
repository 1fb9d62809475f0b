"""The hybrid decode cache: KV for attention layers, conv + SSM state for Mamba layers.

One pytree, laid out like the params: `cache.blocks[b][f"{j}_{kind}"]` holds the state of the
layer at position j of run b, stacked over the run's repeats (leading axis), then the batch
(slot) axis. `lengths[slot]` counts the tokens already absorbed; attention KV capacity is the
third-from-last axis of every KV leaf and is the same for all attention layers.

Slot helpers (`take_slots`, `put_slots`) move whole per-slot states, e.g. to fork one agent's
context into k rollouts without re-running its prefill.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from avalon.model.attention import KV_CACHE_AXES, KVCache, init_kv_cache
from avalon.model.config import LETTERS, ModelConfig
from avalon.model.mamba2 import MAMBA_CACHE_AXES, init_mamba_cache
from avalon.model.params import layer_key


@struct.dataclass
class Cache:
    blocks: list  # per run: {layer_key: MambaCache | KVCache}, each leaf [repeats, b, ...]
    lengths: jax.Array  # [b] int32

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


def cache_axes(cfg: ModelConfig) -> Cache:
    """Logical axes per cache leaf (a `Cache` of tuples), for shardings."""
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
                    lambda ax: ("layers", *ax), KV_CACHE_AXES,
                    is_leaf=lambda x: isinstance(x, tuple))
        blocks.append(entries)
    return Cache(blocks=blocks, lengths=("batch",))


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
