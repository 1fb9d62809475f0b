"""The hybrid forward pass: embeddings, the layer stack as scanned runs, final norm, LM head.

    h = E[tokens]
    for layer i: h = h + mixer_i(RMSNorm_i(h))      (M Mamba-2, E MoE, * attention, - MLP)
    logits = lm_head(RMSNorm_f(h))                  (fp32)

`forward(params, tokens, cfg, segment_ids=, cache=, routing=, num_new=, ops=)`:
  tokens       [b, t] int
  segment_ids  [b, t] int, packed training rows (no cache): attention and Mamba state never
               cross a change of id
  cache        `Cache`: continue from it (prefill, chunked prefill, decode); returns the new one
               (contiguous KV, or paged KV with the rows' page table `cache.pages`)
  num_new      [b] int with a cache: the real tokens of each row (rest is right padding)
  routing      [n_moe_layers, b, t, k] int: replay these expert choices (RL routing replay)
  ops          `ops.Ops`: a platform's functions for some layers (None fields: plain JAX)
Returns `ForwardResult(logits [b, t, V] fp32, hidden [b, t, D] (pre-final-norm), cache,
routing [n_moe_layers, b, t, k] int32, moe_dropped [n_moe_layers] int32)`: the choices each MoE
layer dropped at the expert-parallel capacity bound (`ModelConfig.moe_capacity_factor`).

Each run (unit, repeats) of `cfg.blocks` is one `lax.scan` over its stacked params (and stacked
cache), so a deeper model of the same unit compiles in nearly the same time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from avalon.model.attention import attention
from avalon.model.cache import Cache
from avalon.model.config import LETTERS, ModelConfig, Remat
from avalon.model.dense import dense_head, tied_head
from avalon.model.mamba2 import mamba_mixer
from avalon.model.mlp import mlp
from avalon.model.moe import ROUTED_NAME, moe_layer
from avalon.model.norms import rms_norm
from avalon.model.ops import PLAIN, Ops
from avalon.model.params import layer_key
from avalon.sharding import constrain


@struct.dataclass
class ForwardResult:
    logits: jax.Array | None  # [b, t, V] fp32 (None when not requested)
    hidden: jax.Array  # [b, t, D], the residual stream before the final norm
    cache: Cache | None
    routing: jax.Array | None  # [n_moe_layers, b, t, k] int32 (None without MoE layers)
    moe_dropped: jax.Array | None  # [n_moe_layers] int32 choices dropped (None without MoE)


def apply_layer(letter: str, lp: dict, h: jax.Array, cfg: ModelConfig, *, segment_ids=None,
                cache_entry=None, lengths=None, num_new=None, routing=None, pages=None,
                ops: Ops = PLAIN):
    """One pre-norm residual layer. Returns (h, new cache entry or None, MoE output or None:
    (experts [b, t, k], choices dropped)). Its ops are named after the layer kind (`mamba`,
    `moe`, `attention`, `mlp`) in a profile."""
    kind = LETTERS[letter]
    with jax.named_scope(kind):
        x = rms_norm(h, lp["norm"], cfg.layer_norm_epsilon, ops)
        new_entry, moe_out = None, None
        if kind == "mamba":
            y, new_entry = mamba_mixer(lp, x, cfg, segment_ids=segment_ids, cache=cache_entry,
                                       num_new=num_new, ops=ops)
        elif kind == "attention":
            y, new_entry = attention(lp, x, cfg, segment_ids=segment_ids, cache=cache_entry,
                                     lengths=lengths, num_new=num_new, pages=pages, ops=ops)
        elif kind == "moe":
            y, experts, dropped = moe_layer(lp, x, cfg, routing=routing, ops=ops)
            moe_out = (experts, dropped)
        else:
            y = mlp(lp, x, cfg, ops)
        h = constrain(h + y.astype(h.dtype), ("batch", "act_seq", "act_embed"))
    return h, new_entry, moe_out


def _remat(fn, cfg: ModelConfig, training: bool):
    if not training or cfg.remat in _PER_LAYER:
        return fn
    if cfg.remat == Remat.FULL:
        return jax.checkpoint(fn)
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


# Remat.SELECTIVE(_UNITS)'s recompute keeps only the layer (unit) input and the MoE layers'
# expert-parallel routed output (`moe.ROUTED_NAME`, [tokens, latent] bf16): an MoE layer's
# recompute skips the routed experts, whose dispatch chunks recompute themselves in their own
# backward (`remat_chunks`), once.
_PER_LAYER = (Remat.NONE, Remat.SELECTIVE, Remat.SELECTIVE_UNITS)  # no checkpoint per group
_SELECTIVE_POLICY = jax.checkpoint_policies.save_only_these_names(ROUTED_NAME)


def _recomputed_layer(letter: str, lp: dict, h, cfg: ModelConfig, segment_ids, routing,
                      ops: Ops = PLAIN):
    """`apply_layer` (no cache) under `jax.checkpoint`: the backward keeps the layer's input
    and recomputes the rest (Remat.SELECTIVE, for Mamba and MoE layers; see
    `_recomputed_unit` for SELECTIVE_UNITS)."""
    def fn(lp, h, segment_ids, routing):
        out, _, moe_out = apply_layer(letter, lp, h, cfg, segment_ids=segment_ids,
                                      routing=routing, ops=ops)
        return out, moe_out

    out, moe_out = jax.checkpoint(fn, policy=_SELECTIVE_POLICY)(lp, h, segment_ids, routing)
    return out, None, moe_out


def _recomputed_unit(unit: str, cfg: ModelConfig, training: bool) -> bool:
    """Remat.SELECTIVE_UNITS on a unit of Mamba and MoE layers only (Super's "EM" runs): one
    checkpoint over the whole unit, keeping the unit's input (and the routed outputs), not
    each layer's: the saved inputs halve (Super on the pod: 40 fewer [32,768, 4,096] bf16
    tensors per chip, 10.7 GB). Each layer is still recomputed once, but the recompute now
    also runs what only made the next layer's input (the first layer's output projections),
    and the first layers' recomputed activations are alive during the last layer's backward.
    Other units (attention, MLP) stay per layer as under SELECTIVE."""
    return (training and cfg.remat == Remat.SELECTIVE_UNITS and len(unit) > 1
            and set(unit) <= {"M", "E"})


def _first(tree):
    """Repeat 0 of a stacked tree (None stays None)."""
    return None if tree is None else jax.tree.map(lambda a: a[0], tree)


def _lead(tree):
    """A leading repeat axis of size 1 (None stays None)."""
    return None if tree is None else jax.tree.map(lambda a: a[None], tree)


def _run_block(unit: str, reps: int, bp: dict, bc: dict | None, br, h, cfg: ModelConfig,
               segment_ids, lengths, num_new, pages=None, ops: Ops = PLAIN):
    """Scan `reps` repeats of `unit`. br: [reps, m, b, t, k] routing to replay, or None.
    Returns (h, new stacked cache or None, None or (experts [reps, m, b, t, k], dropped
    [reps, m])).

    Without a cache, params (and routing) are the scanned inputs. With a cache, the stacked
    cache is part of the scan *carry* and repeat r's entries are read and written in place
    (dynamic index / dynamic-update-slice): as scan inputs and outputs they would be copied
    into fresh buffers every decode step, doubling the Mamba-state traffic. The stacked params
    are still sliced per repeat (XLA:CPU copies each slice before its matmuls): the engine
    decodes on CPU from `backends.decode.unstack_params`, one block per layer, so no slice is
    taken."""
    moe_positions = [j for j, ch in enumerate(unit) if ch == "E"]
    whole_unit = _recomputed_unit(unit, cfg, training=bc is None)

    def layers(h, lps, entries, routes):
        new_entries, experts, drops = {}, [], []
        for j, ch in enumerate(unit):
            key = layer_key(j, ch)
            r = routes[moe_positions.index(j)] if routes is not None and ch == "E" else None
            if (entries is None and cfg.remat in (Remat.SELECTIVE, Remat.SELECTIVE_UNITS)
                    and ch in "ME" and not whole_unit):
                h, entry, moe_out = _recomputed_layer(ch, lps[key], h, cfg, segment_ids, r, ops)
            else:
                h, entry, moe_out = apply_layer(
                    ch, lps[key], h, cfg, segment_ids=segment_ids,
                    cache_entry=None if entries is None else entries.get(key),
                    lengths=lengths, num_new=num_new, routing=r, pages=pages, ops=ops)
            if entry is not None:
                new_entries[key] = entry
            if moe_out is not None:
                experts.append(moe_out[0])
                drops.append(moe_out[1])
        return h, new_entries, ((jnp.stack(experts), jnp.stack(drops)) if experts else None)

    if bc is None:
        def body(h, xs):
            lps, routes = xs
            h, _, experts = layers(h, lps, None, routes)
            return h, experts

        if whole_unit:
            body = jax.checkpoint(body, policy=_SELECTIVE_POLICY)
        body = _remat(body, cfg, training=True)
        if reps == 1:
            h, experts = body(h, (_first(bp), _first(br)))
            return h, None, _lead(experts)
        h, experts = jax.lax.scan(body, h, (bp, br))
        return h, None, experts

    if reps == 1:
        # No scan for a single repeat: its params and cache entries are read as they are (a
        # length-1 scan would slice them; XLA:CPU materialises such slices).
        h, new_entries, experts = layers(h, _first(bp), _first(bc), _first(br))
        stack = jax.tree.map(lambda a, u: u.astype(a.dtype)[None], bc, new_entries)
        return h, stack, _lead(experts)

    def body_cached(carry, xs):
        h, stack = carry
        lps, routes, r = xs
        entries = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, r, 0, False), stack)
        h, new_entries, experts = layers(h, lps, entries, routes)
        stack = jax.tree.map(
            lambda a, u: jax.lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), r, 0),
            stack, new_entries)
        return (h, stack), experts

    (h, new_stack), experts = jax.lax.scan(body_cached, (h, bc),
                                           (bp, br, jnp.arange(reps, dtype=jnp.int32)))
    return h, new_stack, experts


def forward(params: dict, tokens: jax.Array, cfg: ModelConfig, *, segment_ids=None,
            cache: Cache | None = None, routing=None, num_new=None,
            return_logits: bool = True, ops: Ops = PLAIN) -> ForwardResult:
    if cache is not None and segment_ids is not None:
        raise ValueError("forward: segment_ids (packed training rows) cannot be combined with a "
                         "cache; decode one sequence per slot instead")
    if cache is None and num_new is not None:
        raise ValueError("forward: num_new only applies when continuing from a cache")
    b, t = tokens.shape
    h = take_rows(params["embed"], tokens, ops).astype(cfg.jnp_dtype)
    h = constrain(h, ("batch", "act_seq", "act_embed"))
    lengths = None if cache is None else cache.lengths
    pages = None if cache is None else cache.pages

    new_blocks, routed, dropped, offset = [], [], [], 0
    for bi, (unit, reps) in enumerate(cfg.blocks):
        m = unit.count("E")
        br = None
        if routing is not None and m:
            br = routing[offset:offset + reps * m].reshape(reps, m, *routing.shape[1:])
        offset += reps * m
        h, entries, experts = _run_block(
            unit, reps, params["blocks"][bi], None if cache is None else cache.blocks[bi], br, h,
            cfg, segment_ids, lengths, num_new, pages, ops)
        new_blocks.append(entries)
        if experts is not None:
            idx, drops = experts
            routed.append(idx.reshape(reps * m, *idx.shape[2:]))
            dropped.append(drops.reshape(reps * m))

    new_cache = None
    if cache is not None:
        step = jnp.full((b,), t, jnp.int32) if num_new is None else num_new.astype(jnp.int32)
        new_cache = Cache(blocks=new_blocks, lengths=cache.lengths + step, pages=pages)
    logits = lm_logits(params, h, cfg, ops) if return_logits else None
    return ForwardResult(logits=logits, hidden=h, cache=new_cache,
                         routing=jnp.concatenate(routed) if routed else None,
                         moe_dropped=jnp.concatenate(dropped) if dropped else None)


def take_rows(table: jax.Array, idx: jax.Array, ops: Ops = PLAIN) -> jax.Array:
    """The embedding lookup `jnp.take(table, idx, axis=0)`, on the platform's where one is given
    (`Ops.take_rows`)."""
    if ops.take_rows is not None:
        return ops.take_rows(table, idx)
    return jnp.take(table, idx, axis=0)


def lm_logits(params: dict, hidden: jax.Array, cfg: ModelConfig, ops: Ops = PLAIN) -> jax.Array:
    """Final norm + LM head on the pre-norm hidden [..., D] -> fp32 logits [..., V] (named
    `head` in a profile)."""
    with jax.named_scope("head"):
        h = rms_norm(hidden, params["final_norm"], cfg.layer_norm_epsilon, ops)
        # A tied head is the embedding, unless a decode backend laid it out apart as lm_head.
        if "lm_head" in params:
            logits = dense_head(h, params["lm_head"].astype(h.dtype), ops).astype(jnp.float32)
        else:
            logits = tied_head(h, params["embed"], ops).astype(jnp.float32)
    return constrain(logits, ("batch", "act_seq", "act_vocab")) if logits.ndim == 3 else logits


def mtp_logits(params: dict, hidden: jax.Array, next_tokens: jax.Array, cfg: ModelConfig,
               ops: Ops = PLAIN):
    """One multi-token-prediction step (Super's `*E` head): predicts token t+2 from the main
    model's hidden at t and the token at t+1.

    h = eh_proj([enorm(E[next]), hnorm(hidden)]), then the MTP layers (pre-norm residual), then
    the MTP final norm and the shared LM head. hidden [b, t, D]; next_tokens [b, t]."""
    if not cfg.mtp_pattern:
        raise ValueError("mtp_logits: this config has no MTP block (mtp_pattern is empty)")
    with jax.named_scope("mtp_head"):
        return _mtp_logits(params, hidden, next_tokens, cfg, ops)


def _mtp_logits(params: dict, hidden: jax.Array, next_tokens: jax.Array, cfg: ModelConfig,
                ops: Ops):
    mp = params["mtp"]
    eps = cfg.layer_norm_epsilon
    e = take_rows(params["embed"], next_tokens, ops).astype(cfg.jnp_dtype)
    x = jnp.concatenate([rms_norm(e, mp["enorm"], eps, ops),
                         rms_norm(hidden, mp["hnorm"], eps, ops)], -1)
    h = x @ mp["eh_proj"].astype(x.dtype)
    for ch, lp in zip(cfg.mtp_pattern, mp["layers"]):
        h, _, _ = apply_layer(ch, lp, h, cfg, ops=ops)
    h = rms_norm(h, mp["final_norm"], eps, ops)
    if cfg.tie_word_embeddings:
        return tied_head(h, params["embed"], ops).astype(jnp.float32)
    return dense_head(h, params["lm_head"].astype(h.dtype), ops).astype(jnp.float32)
