"""The engine's device side: the slot state and the jitted programs that move and advance it.

`SlotState` is one donated pytree: the hybrid cache (attention KV head-major
[repeats, slots, kv_heads, capacity, head_dim], Mamba conv state and fp32 SSM state, `lengths`)
plus `hidden` [slots, D], the pre-norm hidden state of each slot's last absorbed token (a turn
with no new tokens samples its first token from it, so no logits are kept between turns).

Every program is a module-level `jax.jit` with the static `Setup` (config, mesh, context window,
tokens per dispatch), so engines with the same setup share compiled code. Under a mesh each
program traces inside `use_rules(mesh, DECODE_RULES)` (slots over data/fsdp, heads and experts
over the model axes) and pins its output state to those rules; params are used as given.

Programs (R rows of a working state, C its KV capacity; idx entries >= slots are padding):
  gather(main, idx)            -> an R-row working state at capacity C (padding rows empty)
  scatter(main, idx, work)     -> main with the real rows of work written back (donates main)
  resize(state)                -> KV capacity changed to C (donates)
  reset(state, idx)            -> slots idx emptied: Mamba state, length, hidden zeroed
  copy_slot(state, src, dst)   -> slots dst become copies of slot src (fork; donates)
  prefill(params, state, tokens [R, T], num_new [R], routing) -> (state, routing [m, R, T, k])
  snapshot(state) / restore(state, snap, mask): the Mamba part, lengths and hidden
  decode(params, state, live, remaining, halt, knobs, stop_tokens) -> S tokens per live row
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding

from avalon.inference.sampling import SamplingKnobs, sample
from avalon.model.attention import KVCache
from avalon.model.cache import Cache, cache_axes, init_cache, resize_kv
from avalon.model.config import ModelConfig
from avalon.model.mamba2 import MambaCache
from avalon.model.model import forward, lm_logits
from avalon.sharding import DECODE_RULES, constrain, logical_to_spec, tree_shardings, use_rules

# Decode step codes (0 = keep going); the host maps them to `StopReason`.
CODE_STOP, CODE_LENGTH, CODE_CONTEXT_FULL = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Setup:
    """Static parameters of every device program (hashable: a jit static argument)."""

    cfg: ModelConfig
    mesh: Mesh | None
    max_context: int
    steps: int  # tokens per decode dispatch

    @property
    def routing_dtype(self):
        return jnp.int16 if self.cfg.n_routed_experts < 2 ** 15 else jnp.int32


@struct.dataclass
class SlotState:
    cache: Cache
    hidden: jax.Array  # [slots, D], cfg.dtype


@struct.dataclass
class Snapshot:
    """What decode changes irreversibly: Mamba entries, lengths, hidden (KV below `lengths`
    is never overwritten by later positions, so it needs no copy)."""

    mamba: list  # per run: {layer_key: MambaCache}
    lengths: jax.Array
    hidden: jax.Array


@struct.dataclass
class DecodeOut:
    """Per decode step s and row r (stacked over the S steps of a dispatch)."""

    tokens: jax.Array  # [S, R] int32 sampled
    logprobs: jax.Array  # [S, R] fp32
    emitted: jax.Array  # [S, R] bool: the row sampled (and absorbed) a token at this step
    code: jax.Array  # [S, R] int8: CODE_* when the row's turn ended at this step, else 0
    routing: jax.Array | None  # [S, m, R, k]: experts used with the absorbed token


def state_axes(cfg: ModelConfig) -> SlotState:
    return SlotState(cache=cache_axes(cfg), hidden=("batch", "act_embed"))


def _is_axes(x) -> bool:
    return isinstance(x, tuple)


def _pin(state: SlotState, cfg: ModelConfig) -> SlotState:
    """Constrain every leaf to the active rules (a no-op without a mesh)."""
    return jax.tree.map(lambda axes, a: constrain(a, axes), state_axes(cfg), state,
                        is_leaf=_is_axes)


def _rules(setup: Setup):
    return contextlib.nullcontext() if setup.mesh is None else use_rules(setup.mesh, DECODE_RULES)


def init_state(setup: Setup, slots: int, capacity: int) -> SlotState:
    """Empty state for `slots` slots, placed on the mesh by DECODE_RULES when there is one."""
    cfg = setup.cfg
    state = SlotState(cache=init_cache(cfg, slots, capacity),
                      hidden=jnp.zeros((slots, cfg.hidden_size), cfg.jnp_dtype))
    if setup.mesh is not None:
        state = jax.device_put(state, tree_shardings(state_axes(cfg), state, setup.mesh,
                                                     DECODE_RULES))
    return state


def put_rows(setup: Setup, tree):
    """Place per-row host arrays ([R, ...]) as the decode program returns them: rows over
    data/fsdp under a mesh. Keeping one placement across dispatches keeps one compiled program."""
    if setup.mesh is None:
        return jax.device_put(tree)

    def one(x):
        spec = logical_to_spec(("batch",), DECODE_RULES, setup.mesh, x.shape[:1])
        return jax.device_put(x, NamedSharding(setup.mesh, spec))
    return jax.tree.map(one, tree)


def kv_capacity(state: SlotState) -> int | None:
    return state.cache.capacity


def _map_entries(cache: Cache, fn_kv, fn_mamba) -> list:
    def one(entry):
        return fn_kv(entry) if isinstance(entry, KVCache) else fn_mamba(entry)
    return [{key: one(e) for key, e in blk.items()} for blk in cache.blocks]


def _row_mask(mask: jax.Array, leaf: jax.Array) -> jax.Array:
    """mask [R] shaped to broadcast against a cache leaf [repeats, R, ...]."""
    return mask.reshape(1, -1, *([1] * (leaf.ndim - 2)))


# ---- moving state -----------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("setup", "capacity"))
def gather(main: SlotState, idx: jax.Array, *, setup: Setup, capacity: int) -> SlotState:
    with _rules(setup):
        take = functools.partial(jnp.take, indices=idx, axis=1, mode="fill", fill_value=0)
        blocks = jax.tree.map(lambda a: take(a), main.cache.blocks)
        lengths = jnp.take(main.cache.lengths, idx, mode="fill", fill_value=0)
        cache = resize_kv(Cache(blocks=blocks, lengths=lengths), capacity)
        hidden = jnp.take(main.hidden, idx, axis=0, mode="fill", fill_value=0)
        return _pin(SlotState(cache=cache, hidden=hidden), setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("main",))
def scatter(main: SlotState, idx: jax.Array, work: SlotState, *, setup: Setup) -> SlotState:
    cap = kv_capacity(main)
    if cap is not None and kv_capacity(work) > cap:
        raise ValueError(f"scatter: working capacity {kv_capacity(work)} exceeds the main "
                         f"state's {cap}; grow the main state first")
    with _rules(setup):
        wc = work.cache if cap is None else resize_kv(work.cache, cap)
        put = lambda a, w: a.at[:, idx].set(w.astype(a.dtype), mode="drop")
        blocks = jax.tree.map(put, main.cache.blocks, wc.blocks)
        lengths = main.cache.lengths.at[idx].set(wc.lengths, mode="drop")
        hidden = main.hidden.at[idx].set(work.hidden, mode="drop")
        return _pin(SlotState(cache=Cache(blocks=blocks, lengths=lengths), hidden=hidden),
                    setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup", "capacity"), donate_argnames=("state",))
def _resize(state: SlotState, *, setup: Setup, capacity: int) -> SlotState:
    with _rules(setup):
        return _pin(SlotState(cache=resize_kv(state.cache, capacity), hidden=state.hidden),
                    setup.cfg)


def resize(state: SlotState, *, setup: Setup, capacity: int) -> SlotState:
    """KV capacity changed to `capacity`. The state is donated: Mamba leaves are reused in
    place; the KV leaves change shape, so JAX's notice that their donation went unused is
    expected and silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return _resize(state, setup=setup, capacity=capacity)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def reset(state: SlotState, idx: jax.Array, *, setup: Setup) -> SlotState:
    """Empty slots idx: zero Mamba state, length and hidden. KV needs no clearing: positions at
    or past a slot's length are never read."""
    with _rules(setup):
        zero = lambda a: a.at[:, idx].set(0, mode="drop")
        blocks = _map_entries(state.cache, lambda e: e, lambda e: jax.tree.map(zero, e))
        lengths = state.cache.lengths.at[idx].set(0, mode="drop")
        hidden = state.hidden.at[idx].set(0, mode="drop")
        return _pin(SlotState(cache=Cache(blocks=blocks, lengths=lengths), hidden=hidden),
                    setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def copy_slot(state: SlotState, src: jax.Array, dst: jax.Array, *, setup: Setup) -> SlotState:
    """Slots dst [k] (padding >= slots is dropped) become copies of slot src (scalar)."""
    with _rules(setup):
        k = dst.shape[0]

        def put(a):
            row = jnp.take(a, src, axis=1)  # [repeats, ...]
            rows = jnp.broadcast_to(row[:, None], (a.shape[0], k, *row.shape[1:]))
            return a.at[:, dst].set(rows, mode="drop")

        blocks = jax.tree.map(put, state.cache.blocks)
        lengths = state.cache.lengths.at[dst].set(state.cache.lengths[src], mode="drop")
        hidden = state.hidden.at[dst].set(state.hidden[src], mode="drop")
        return _pin(SlotState(cache=Cache(blocks=blocks, lengths=lengths), hidden=hidden),
                    setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",))
def snapshot(state: SlotState, *, setup: Setup) -> Snapshot:
    del setup
    mamba = [{key: jax.tree.map(jnp.copy, e) for key, e in blk.items()
              if isinstance(e, MambaCache)} for blk in state.cache.blocks]
    return Snapshot(mamba=mamba, lengths=jnp.copy(state.cache.lengths),
                    hidden=jnp.copy(state.hidden))


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def restore(state: SlotState, snap: Snapshot, mask: jax.Array, *, setup: Setup) -> SlotState:
    """Rows where mask [R] is true go back to the snapshot's Mamba state, length, hidden."""
    with _rules(setup):
        pick = lambda old, cur: jnp.where(_row_mask(mask, cur), old, cur)
        blocks = [{key: (e if isinstance(e, KVCache) else jax.tree.map(pick, snap_blk[key], e))
                   for key, e in blk.items()}
                  for blk, snap_blk in zip(state.cache.blocks, snap.mamba)]
        lengths = jnp.where(mask, snap.lengths, state.cache.lengths)
        hidden = jnp.where(mask[:, None], snap.hidden, state.hidden)
        return _pin(SlotState(cache=Cache(blocks=blocks, lengths=lengths), hidden=hidden),
                    setup.cfg)


# ---- running the model ------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def prefill(params: dict, state: SlotState, tokens: jax.Array, num_new: jax.Array,
            routing: jax.Array | None, *, setup: Setup):
    """Append tokens[r, :num_new[r]] to each row (right padding ignored). `routing`
    [m, R, T, k] replays expert choices (None: route live). Returns (state, experts used
    [m, R, T, k] or None)."""
    cfg = setup.cfg
    with _rules(setup):
        r = forward(params, tokens, cfg, cache=state.cache, num_new=num_new, routing=routing,
                    return_logits=False)
        last = jnp.maximum(num_new - 1, 0)
        h_last = jnp.take_along_axis(r.hidden, last[:, None, None], axis=1)[:, 0]
        hidden = jnp.where((num_new > 0)[:, None], h_last.astype(state.hidden.dtype),
                           state.hidden)
        used = None if r.routing is None else r.routing.astype(setup.routing_dtype)
        return _pin(SlotState(cache=r.cache, hidden=hidden), cfg), used


def _decode_step(params, carry, knobs: SamplingKnobs, stop_tokens, setup: Setup):
    """Sample one token per live row from its last hidden state, then absorb it."""
    state, live, remaining = carry
    cfg = setup.cfg
    lengths = state.cache.lengths
    logits = lm_logits(params, state.hidden, cfg)  # [R, V] fp32
    tokens, logprobs = sample(logits, knobs, lengths)
    remaining = remaining - live.astype(jnp.int32)
    is_stop = jnp.any(tokens[:, None] == stop_tokens, axis=-1)
    full = lengths + 1 >= setup.max_context  # after absorbing this token the window is full
    code = jnp.where(is_stop, CODE_STOP,
                     jnp.where(remaining <= 0, CODE_LENGTH,
                               jnp.where(full, CODE_CONTEXT_FULL, 0)))
    code = jnp.where(live, code, 0).astype(jnp.int8)
    r = forward(params, tokens[:, None], cfg, cache=state.cache, num_new=live.astype(jnp.int32),
                return_logits=False)
    hidden = jnp.where(live[:, None], r.hidden[:, 0].astype(state.hidden.dtype), state.hidden)
    routing = None if r.routing is None else r.routing[:, :, 0].astype(setup.routing_dtype)
    out = DecodeOut(tokens=tokens, logprobs=logprobs, emitted=live, code=code, routing=routing)
    new_state = _pin(SlotState(cache=r.cache, hidden=hidden), cfg)
    return (new_state, live & (code == 0), remaining), out


@functools.partial(jax.jit, static_argnames=("setup",),
                   donate_argnames=("state", "live", "remaining"))
def decode(params: dict, state: SlotState, live: jax.Array, remaining: jax.Array,
           halt: jax.Array, knobs: SamplingKnobs, stop_tokens: jax.Array, *, setup: Setup):
    """`setup.steps` decode steps over every row in one scan. live [R] bool (rows still
    sampling), remaining [R] int32 (tokens each may still sample), halt [R] bool (rows the host
    ended, e.g. on a stop string), stop_tokens [R, n] int32 (-1 padding).

    Rows that are not live are fed with num_new = 0, which leaves their state untouched. There
    is deliberately no `lax.cond` skipping steps once every row ended: on XLA:CPU it doubled
    the copies of Mamba state leaves in the step (see `experiments/bench/decode.py
    --count_copies`), a cost on every step against a saving only at the end of a turn.
    Returns (state, live, remaining, DecodeOut stacked over steps)."""
    with _rules(setup):
        live = live & ~halt

        def step(carry, _):
            return _decode_step(params, carry, knobs, stop_tokens, setup)

        (state, live, remaining), outs = jax.lax.scan(step, (state, live, remaining), None,
                                                      length=setup.steps)
        live, remaining = constrain(live, ("batch",)), constrain(remaining, ("batch",))
        return state, live, remaining, outs
