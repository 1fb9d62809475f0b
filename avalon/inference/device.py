"""The engine's device side: the slot state and the jitted programs that move and advance it.

`SlotState` is one donated pytree:
  cache      the paged hybrid cache: attention KV in a page pool shared by all slots
             [repeats, pages, kv_heads, page_size, head_dim] (the host's `PagePool` says which
             pages each slot holds), Mamba conv state and fp32 SSM state fixed per slot
             [repeats, slots, ...], `lengths` [slots];
  hidden     [slots, D], the pre-norm hidden state of each slot's last absorbed token (a turn
             with no new tokens samples its first token from it, so no logits are kept);
  live       [slots] bool, the slot's turn is still sampling (decided on device: stop tokens,
             max_new_tokens and the window end it, so dispatches can run ahead of the host);
  remaining  [slots] int32, tokens the slot's turn may still sample.

Every program takes the rows it runs over as `idx` [R] (slot ids; entries >= slots are padding
rows, empty and dropped on the way back) with their page table `pages` [R, W]: it gathers
those slots' per-slot state, runs, and scatters it back, while KV is read and written in the
pool in place. So any set of slots can make up a dispatch: new turns join and finished ones
leave between dispatches (continuous batching), and rows without work are not computed.

Every program is a module-level `jax.jit` with the static `Setup`, so engines with the same
setup share compiled code. Under a mesh each program traces inside
`use_rules(mesh, DECODE_RULES)`: slots and a dispatch's rows over data/fsdp, Mamba heads over
tensor x expert (the dense layers tensor-parallel), the KV pool's pages over every device
(each attends over its own pages; `PagePool` puts page j of a slot on chip j % chips); params
are used as given.

Programs:
  grow(state, num_pages)        -> the pool grown to num_pages pages (contents kept; donates)
  reset(state, idx)             -> slots idx emptied: Mamba state, length, hidden, live zeroed
  fork(state, src, dst, page_src, page_dst) -> slots dst copy slot src; pool pages copied
  arm(state, idx, live, remaining) -> the rows' turns start (or not) sampling
  prefill(params, state, idx, pages, tokens [R, T], num_new [R], routing) -> (state, experts)
  snapshot(state, idx) / restore(state, idx, snap): the rows' Mamba part, lengths and hidden
  decode(params, state, idx, pages, knobs, stop_tokens) -> S tokens per live row
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding

from avalon.backends.platform import kv_storage_dtype, model_ops
from avalon.inference.sampling import SamplingKnobs, sample
from avalon.model import cache as C
from avalon.model.config import ModelConfig
from avalon.model.model import forward, lm_logits
from avalon.model.ops import Ops
from avalon.sharding import (
    DECODE_RULES,
    batch_axes,
    constrain,
    logical_to_spec,
    platform,
    tree_shardings,
    use_rules,
)

# Decode step codes (0 = keep going); the host maps them to `StopReason`.
CODE_STOP, CODE_LENGTH, CODE_CONTEXT_FULL = 1, 2, 3


def routing_dtype(num_experts: int):
    """The narrowest integer type that holds every expert index."""
    if num_experts <= 256:
        return np.uint8
    return np.int16 if num_experts <= 2 ** 15 else np.int32


@dataclasses.dataclass(frozen=True)
class Setup:
    """Static parameters of every device program (hashable: a jit static argument)."""

    cfg: ModelConfig
    mesh: Mesh | None
    max_context: int
    steps: int  # tokens per decode dispatch
    page_size: int  # KV positions per pool page

    @property
    def routing_dtype(self):
        return routing_dtype(self.cfg.n_routed_experts)

    @property
    def platform(self) -> str:
        """Where the programs run: the mesh's devices' platform, else the default backend's."""
        return platform(self.mesh)

    @property
    def ops(self) -> Ops:
        """The functions the model's layers run with on this platform (`backends.platform`)."""
        return model_ops(self.platform, self.cfg)

    @property
    def kv_storage(self):
        """The dtype the KV pool is stored as on this platform (on CPU a bf16 pool as its bit
        patterns: `backends.cpu_bits`)."""
        return kv_storage_dtype(self.cfg.jnp_dtype, self.platform)

    @property
    def pool_shards(self) -> int:
        """Chips the KV pool's pages are split over (DECODE_RULES' `kv_pages` axes); the
        engine keeps its pool a multiple of it (`pages.py`)."""
        if self.mesh is None:
            return 1
        rule = DECODE_RULES["kv_pages"]
        axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
        return math.prod(self.mesh.shape[a] for a in axes)

    @property
    def row_split(self) -> int:
        """Chips a dispatch's rows are split over (DECODE_RULES' `batch` axes)."""
        return 1 if self.mesh is None else \
            math.prod(self.mesh.shape[a] for a in batch_axes(self.mesh, DECODE_RULES))


@struct.dataclass
class SlotState:
    cache: C.Cache
    hidden: jax.Array  # [slots, D], cfg.dtype
    live: jax.Array  # [slots] bool
    remaining: jax.Array  # [slots] int32


@struct.dataclass
class Snapshot:
    """What decode changes irreversibly in rows idx: Mamba entries, lengths, hidden (KV below a
    row's length is never overwritten by later positions, so it needs no copy)."""

    rows: C.Cache  # the rows' Mamba state and lengths (the pool left out: blocks hold Mamba only)
    hidden: jax.Array


@struct.dataclass
class DecodeOut:
    """Per decode step s and row r (stacked over the S steps of a dispatch)."""

    tokens: jax.Array  # [S, R] int32 sampled
    logprobs: jax.Array  # [S, R] fp32
    emitted: jax.Array  # [S, R] bool: the row sampled (and absorbed) a token at this step
    code: jax.Array  # [S, R] int8: CODE_* when the row's turn ended at this step, else 0
    routing: jax.Array | None  # [S, m, R, k] `routing_dtype`: experts used with the token


def state_axes(cfg: ModelConfig) -> SlotState:
    """Logical axes of the stored state: the model's cache axes with the slot axis named
    `slots` (DECODE_RULES: data/fsdp; a slot's Mamba state is split by heads over the other
    axes) and the pool's page axis `kv_pages` (every axis)."""
    def slots(axes):
        return tuple("slots" if a == "batch" else a for a in axes)
    return jax.tree.map(slots, SlotState(cache=C.cache_axes(cfg, paged=True),
                                         hidden=("batch", "act_embed"), live=("batch",),
                                         remaining=("batch",)), is_leaf=_is_axes)


def _is_axes(x) -> bool:
    return isinstance(x, tuple)


def _pin(state: SlotState, cfg: ModelConfig) -> SlotState:
    """Constrain every leaf to the active rules (a no-op without a mesh)."""
    return jax.tree.map(lambda axes, a: constrain(a, axes), state_axes(cfg), state,
                        is_leaf=_is_axes)


def _rules(setup: Setup):
    return contextlib.nullcontext() if setup.mesh is None else use_rules(setup.mesh, DECODE_RULES)


def state_shardings(setup: Setup, state: SlotState):
    """NamedSharding per leaf of a slot state under DECODE_RULES (the decode rules table)."""
    return tree_shardings(state_axes(setup.cfg), state, setup.mesh, DECODE_RULES)


def init_state(setup: Setup, slots: int, num_pages: int) -> SlotState:
    """Empty state for `slots` slots and a pool of `num_pages` pages, placed on the mesh by
    DECODE_RULES when there is one."""
    cfg = setup.cfg
    cache = C.init_paged_cache(cfg, slots, num_pages, setup.page_size, setup.kv_storage)
    state = SlotState(cache=cache,
                      hidden=jnp.zeros((slots, cfg.hidden_size), cfg.jnp_dtype),
                      live=jnp.zeros((slots,), bool), remaining=jnp.zeros((slots,), jnp.int32))
    if setup.mesh is not None:
        state = jax.device_put(state, state_shardings(setup, state))
    return state


def abstract_state(setup: Setup, slots: int, num_pages: int) -> SlotState:
    """`init_state`'s shapes and dtypes, without allocating (for AOT lowering)."""
    cfg = setup.cfg
    return jax.eval_shape(lambda: SlotState(
        cache=C.init_paged_cache(cfg, slots, num_pages, setup.page_size, setup.kv_storage),
        hidden=jnp.zeros((slots, cfg.hidden_size), cfg.jnp_dtype),
        live=jnp.zeros((slots,), bool), remaining=jnp.zeros((slots,), jnp.int32)))


def abstract_decode_inputs(setup: Setup, slots: int, num_pages: int, rows: int, width: int):
    """Abstract (ShapeDtypeStruct, sharded under setup.mesh) arguments of `decode` after the
    params: (state, idx, pages, knobs, stop_tokens), for `slots` slots, a pool of `num_pages`
    pages, a dispatch of `rows` rows whose page tables are `width` pages wide. For AOT:

        args = abstract_decode_inputs(setup, slots, num_pages, rows, width)
        decode.lower(abstract_params, *args, setup=setup).compile()
    """
    state = abstract_state(setup, slots, num_pages)

    def row_spec(shape):
        if setup.mesh is None:
            return None
        spec = logical_to_spec(("batch",), DECODE_RULES, setup.mesh, shape[:1])
        return NamedSharding(setup.mesh, spec)

    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=row_spec(shape))

    if setup.mesh is not None:
        shard = state_shardings(setup, state)
        state = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                             state, shard)
    knobs = SamplingKnobs(temperature=sds((rows,), jnp.float32), top_p=sds((rows,), jnp.float32),
                          top_k=sds((rows,), jnp.int32), greedy=sds((rows,), bool),
                          seed=sds((rows,), jnp.uint32))
    return (state, sds((rows,), jnp.int32), sds((rows, width), jnp.int32), knobs,
            sds((rows, 1), jnp.int32))


def put_rows(setup: Setup, tree):
    """Place per-row host arrays ([R, ...]) rows over data/fsdp under a mesh. Keeping one
    placement across dispatches keeps one compiled program."""
    if setup.mesh is None:
        return jax.device_put(tree)

    def one(x):
        spec = logical_to_spec(("batch",), DECODE_RULES, setup.mesh, x.shape[:1])
        return jax.device_put(x, NamedSharding(setup.mesh, spec))
    return jax.tree.map(one, tree)


@struct.dataclass
class _Rows:
    cache: C.Cache  # rows' Mamba state, lengths, page table; the shared pool
    hidden: jax.Array
    live: jax.Array
    remaining: jax.Array


def _take(a, idx):
    return jnp.take(a, idx, axis=0, mode="fill", fill_value=0)


def _gather(state: SlotState, idx, pages, cfg: ModelConfig | None = None) -> _Rows:
    rows = _Rows(cache=C.take_rows(state.cache, idx, pages), hidden=_take(state.hidden, idx),
                 live=_take(state.live, idx), remaining=_take(state.remaining, idx))
    return rows if cfg is None else _pin_rows(rows, cfg)


def _pin_rows(rows: _Rows, cfg: ModelConfig) -> _Rows:
    """The gathered rows split like the slots they came from (rows over the slot axes, heads
    over tensor). Left to itself XLA may keep a gathered copy whole on every chip: the working
    Mamba state of a dispatch, replicated (RESULTS.md, the pod's decode AOT)."""
    axes = state_axes(cfg)
    pin = lambda ax, a: constrain(a, ax)
    cache = jax.tree.map(pin, axes.cache, rows.cache.replace(pages=None), is_leaf=_is_axes)
    return _Rows(cache=cache.replace(pages=rows.cache.pages), hidden=pin(axes.hidden, rows.hidden),
                 live=pin(axes.live, rows.live), remaining=pin(axes.remaining, rows.remaining))


def _scatter(state: SlotState, idx, rows: _Rows, cfg: ModelConfig) -> SlotState:
    put = lambda a, r: a.at[idx].set(r.astype(a.dtype), mode="drop")
    return _pin(SlotState(cache=C.put_rows(state.cache, idx, rows.cache),
                          hidden=put(state.hidden, rows.hidden), live=put(state.live, rows.live),
                          remaining=put(state.remaining, rows.remaining)), cfg)


# ---- moving state -----------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("setup", "num_pages"), donate_argnames=("state",))
def _grow(state: SlotState, *, setup: Setup, num_pages: int) -> SlotState:
    with _rules(setup):
        return _pin(state.replace(cache=C.grow_pool(state.cache, num_pages, setup.pool_shards)),
                    setup.cfg)


def release_programs() -> None:
    """Drop every compiled prefill and decode program (they recompile on their next call)."""
    prefill.clear_cache()
    decode.clear_cache()


def grow(state: SlotState, *, setup: Setup, num_pages: int) -> SlotState:
    """The pool grown to `num_pages` pages. The state is donated: per-slot leaves are reused in
    place; the pool leaves change shape, so JAX's notice that their donation went unused is
    expected and silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return _grow(state, setup=setup, num_pages=num_pages)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def reset(state: SlotState, idx: jax.Array, *, setup: Setup) -> SlotState:
    """Empty slots idx: zero Mamba state, length, hidden, live. KV needs no clearing: positions
    at or past a slot's length are never read."""
    with _rules(setup):
        rows = _gather(state, idx, None)
        blocks = [{k: (e if isinstance(e, C.PagedKV) else jax.tree.map(jnp.zeros_like, e))
                   for k, e in blk.items()} for blk in rows.cache.blocks]
        zero = _Rows(cache=rows.cache.replace(blocks=blocks,
                                              lengths=jnp.zeros_like(rows.cache.lengths)),
                     hidden=jnp.zeros_like(rows.hidden), live=jnp.zeros_like(rows.live),
                     remaining=jnp.zeros_like(rows.remaining))
        return _scatter(state, idx, zero, setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def fork(state: SlotState, src: jax.Array, dst: jax.Array, page_src: jax.Array,
         page_dst: jax.Array, *, setup: Setup) -> SlotState:
    """Slots dst [k] (padding >= slots dropped) become copies of slot src (scalar): Mamba state,
    length, hidden. Pool pages page_dst[i] become copies of page_src[i] (the source's last,
    partly filled page; full pages are shared by the page tables instead of copied)."""
    with _rules(setup):
        k = dst.shape[0]
        state = state.replace(cache=C.copy_pages(state.cache, page_src, page_dst))
        rows = _gather(state, jnp.broadcast_to(src, (k,)), None)
        return _scatter(state, dst, rows.replace(live=jnp.zeros((k,), bool)), setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def arm(state: SlotState, idx: jax.Array, live: jax.Array, remaining: jax.Array, *,
        setup: Setup) -> SlotState:
    """Rows idx start their turns: live [R] bool, remaining [R] int32 tokens to sample."""
    with _rules(setup):
        return _pin(state.replace(live=state.live.at[idx].set(live, mode="drop"),
                                  remaining=state.remaining.at[idx].set(remaining, mode="drop")),
                    setup.cfg)


@functools.partial(jax.jit, static_argnames=("setup",))
def snapshot(state: SlotState, idx: jax.Array, *, setup: Setup) -> Snapshot:
    with _rules(setup):
        rows = _gather(state, idx, None)
        blocks = [{k: e for k, e in blk.items() if not isinstance(e, C.PagedKV)}
                  for blk in rows.cache.blocks]
        return Snapshot(rows=rows.cache.replace(blocks=blocks), hidden=rows.hidden)


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def restore(state: SlotState, idx: jax.Array, snap: Snapshot, *, setup: Setup) -> SlotState:
    """Slots idx (padding dropped) go back to the snapshot's Mamba state, length, hidden."""
    with _rules(setup):
        rows = _gather(state, idx, None)
        blocks = [{k: snap.rows.blocks[bi].get(k, e) for k, e in blk.items()}
                  for bi, blk in enumerate(rows.cache.blocks)]
        rows = rows.replace(cache=rows.cache.replace(blocks=blocks, lengths=snap.rows.lengths),
                            hidden=snap.hidden)
        return _scatter(state, idx, rows, setup.cfg)


# ---- running the model ------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def prefill(params: dict, state: SlotState, idx: jax.Array, pages: jax.Array, tokens: jax.Array,
            num_new: jax.Array, routing: jax.Array | None, *, setup: Setup):
    """Append tokens[r, :num_new[r]] to the slot of each row (right padding ignored). `routing`
    [m, R, T, k] replays expert choices (None: route live). Returns (state, experts used
    [m, R, T, k] `routing_dtype`, or None)."""
    cfg = setup.cfg
    with _rules(setup):
        rows = _gather(state, idx, pages, cfg)
        r = forward(params, tokens, cfg, cache=rows.cache, num_new=num_new, routing=routing,
                    return_logits=False, ops=setup.ops)
        last = jnp.maximum(num_new - 1, 0)
        h_last = jnp.take_along_axis(r.hidden, last[:, None, None], axis=1)[:, 0]
        hidden = jnp.where((num_new > 0)[:, None], h_last.astype(rows.hidden.dtype), rows.hidden)
        used = None if r.routing is None else r.routing.astype(setup.routing_dtype)
        return _scatter(state, idx, rows.replace(cache=r.cache, hidden=hidden), cfg), used


def _decode_step(params, rows: _Rows, knobs: SamplingKnobs, stop_tokens, setup: Setup):
    """Sample one token per live row from its last hidden state, then absorb it."""
    cfg = setup.cfg
    live, remaining = rows.live, rows.remaining
    lengths = rows.cache.lengths
    logits = lm_logits(params, rows.hidden, cfg, setup.ops)  # [R, V] fp32
    tokens, logprobs = sample(logits, knobs, lengths)
    remaining = remaining - live.astype(jnp.int32)
    is_stop = jnp.any(tokens[:, None] == stop_tokens, axis=-1)
    full = lengths + 1 >= setup.max_context  # after absorbing this token the window is full
    code = jnp.where(is_stop, CODE_STOP,
                     jnp.where(remaining <= 0, CODE_LENGTH,
                               jnp.where(full, CODE_CONTEXT_FULL, 0)))
    code = jnp.where(live, code, 0).astype(jnp.int8)
    r = forward(params, tokens[:, None], cfg, cache=rows.cache, num_new=live.astype(jnp.int32),
                return_logits=False, ops=setup.ops)
    hidden = jnp.where(live[:, None], r.hidden[:, 0].astype(rows.hidden.dtype), rows.hidden)
    routing = None if r.routing is None else r.routing[:, :, 0].astype(setup.routing_dtype)
    out = DecodeOut(tokens=tokens, logprobs=logprobs, emitted=live, code=code, routing=routing)
    return _Rows(cache=r.cache, hidden=hidden, live=live & (code == 0), remaining=remaining), out


@functools.partial(jax.jit, static_argnames=("setup",), donate_argnames=("state",))
def decode(params: dict, state: SlotState, idx: jax.Array, pages: jax.Array,
           knobs: SamplingKnobs, stop_tokens: jax.Array, *, setup: Setup):
    """`setup.steps` decode steps over rows idx [R] in one scan; pages [R, W] must cover each
    row's length + steps. knobs [R], stop_tokens [R, n] int32 (-1 padding).

    Rows that are not live are fed with num_new = 0, which leaves their state untouched. There
    is deliberately no `lax.cond` skipping steps once every row ended: on XLA:CPU it doubled
    the copies of Mamba state leaves in the step (see `experiments/bench/decode.py
    --count_copies`), a cost on every step against a saving only at the end of a turn.
    Returns (state, DecodeOut stacked over steps)."""
    with _rules(setup):
        rows = _gather(state, idx, pages, setup.cfg)

        def step(rows, _):
            return _decode_step(params, rows, knobs, stop_tokens, setup)

        rows, outs = jax.lax.scan(step, rows, None, length=setup.steps)
        return _scatter(state, idx, rows, setup.cfg), outs
