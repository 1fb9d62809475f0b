"""The slot engine: a host scheduler over one donated device state (see `device.py`).

    engine = Engine(cfg, params, num_slots=64, detokenize=tok.decode)
    a = engine.allocate()
    [r] = engine.generate([TurnRequest(slot=a, new_tokens=prompt, max_new_tokens=256)])
    rollouts = engine.fork(a, 16)          # 16 slots sharing a's context, no prefill

    # continuous batching: hand over turns whenever they are ready, collect them as they end
    engine.submit([TurnRequest(b, obs_b, 512)])
    while engine.busy:
        for res in engine.step():          # one scheduling round: <= 1 dispatch + 1 fetch
            engine.submit(next_turns_after(res))

A slot is one agent's context. KV lives in a page pool (`pages.py`: pages are handed to a slot
as its context grows and return when it is released; forks share full pages), so attention
memory follows the tokens held, not slots x the longest context. Mamba state is fixed per slot.

Serving (`submit` + `step`; `generate` = submit, then step until those turns are done):
1. Admission. A turn whose new tokens do not fit the window ends at once with CONTEXT_FULL
   (nothing absorbed). Every other turn is active until it ends; a slot has at most one. With
   `max_kv_pages` the pool never grows past it: a turn starts only when its worst case (the
   slot's context + new tokens + max_new_tokens) fits beside every running turn's, so no
   dispatch runs out of pages; until then it waits (in submission order). When nothing runs
   and it still does not fit (the pool is full of idle contexts), it samples only as many
   tokens as fit and ends CONTEXT_FULL, or, if not even its new tokens fit, ends POOL_FULL
   with nothing absorbed.
2. Prefill has priority, but never twice running over rows that could sample: while some turns
   still have new tokens to absorb, a step runs one chunk of up to `prefill_chunk` tokens over
   exactly those turns' slots (padded to a rung of
   the chunk ladder, `num_new` per row; where padding would cost more than another dispatch,
   the chunk is a smaller rung and the rest follows, `pages.chunk_take`); slots without new
   tokens are not in the dispatch.
   Attention over pages is an online softmax over page blocks, so the chunk never has to shrink
   with the number of rows.
3. Decode: dispatches of `steps_per_dispatch` tokens over the slots of the turns still sampling,
   whichever they are now: turns admitted since the last dispatch join, turns that ended leave
   (continuous batching). Each step samples from the row's last hidden state and absorbs the
   sampled token at once, so a turn returns with every token it produced in the context and
   `routing` covers new_tokens + tokens. Stop tokens, max_new_tokens and the context window are
   decided on device; stop strings on the host after each dispatch. Two dispatches are kept in
   flight, so host work overlaps device work.
4. Stop strings cut a turn mid-dispatch, after the device already absorbed the tokens that
   follow the cut. The engine snapshots those rows' Mamba state (and lengths, hidden) when they
   start decoding, and for a cut turn restores it and re-absorbs the kept tokens in a prefill
   that replays the experts they were decoded with (KV below the cut is untouched).
5. A turn is finished (returned by `step`) once it ended and no dispatch in flight has its row.

Buckets: rows, chunk lengths and page-table widths are rungs of short fixed ladders
(`Engine.buckets`: decode rows double, the rest grow 4x) and pool sizes powers of two, so a
serving run compiles at most the product of the ladders' lengths per pool size.

Params are read, not copied: `set_params` swaps the reference to new arrays; they may be the
trainer's master params or their bf16 decode view (`inference/weights.py`). The exception is
the decode backend (`backend`, `avalon/backends/decode.py`): on one CPU device (no mesh, or the
trainer's one-device mesh: the laptop case) the default slices the params into one block per
layer and holds the projections and experts packed for the CPU product kernel (or output-first
for XLA's products) once per `set_params`, and the programs run on
`cfg.replace(scan_layers=False)`; elsewhere the params are read in place.

Sampling and its log-probabilities: see `sampling.py`.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from avalon import backends
from avalon.backends import DecodeBackend
from avalon.inference import device as dev
from avalon.inference.api import EngineStats, StopReason, TurnRequest, TurnResult
from avalon.inference.first_run import FirstRuns
from avalon.inference.pages import PagePool, bucket, chunk_take, ladder, pow2_at_least
from avalon.inference.requests import Turn, find_stop_string, validate_requests
from avalon.inference.sampling import SamplingKnobs
from avalon.inference.turns import ActiveTurn, Record
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params

MIN_CHUNK = 8
# Every shape bucket is a rung of a short ladder fixed by the engine's config: a decode row
# count doubles (on a CPU a dispatch costs in proportion to its rows), every other bucket
# (prefill rows, chunk lengths, page-table widths, state-op sizes) grows 4x. Each bucket
# combination is one compiled program (on XLA:CPU ~500 memory maps of JIT code), so doubling
# ladders everywhere let a long toy run compile hundreds of them (RESULTS.md).
DECODE_ROW_RATIO = 2
# One prefill dispatch's fixed cost, in token x row units of padded prefill work: on the toy
# (CPU, one core) a dispatch costs ~13-17 ms besides ~0.3 ms per row and token, so a 64-token
# prompt runs faster as two 32-token chunks than padded to the 128 rung (`pages.chunk_take`;
# docs/results_history.md, "Prefill without 2x padding, the LM head's gradient, ...").
PREFILL_DISPATCH_WORK = 48
BUCKET_RATIO = 4
MIN_ROWS = 8
MIN_PAGES = 16
PIPELINE_DEPTH = 2  # decode dispatches in flight


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Engine: {name}={value!r} must be a positive int")
    return value


def check_params(where: str, params, cfg: ModelConfig) -> None:
    """params must match the config's params in structure and shapes; dtypes may be the
    master's (cfg.param_dtype) or a narrower float decode view (e.g. bf16)."""
    like = abstract_params(cfg)
    if jax.tree.structure(params) != jax.tree.structure(like):
        raise ValueError(f"{where}: the params' tree structure differs from the config's "
                         "(params for another config?)")
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(like), jax.tree.leaves(like),
                          jax.tree.leaves(params)):
        same_kind = a.dtype == b.dtype or (jnp.issubdtype(a.dtype, jnp.floating)
                                           and jnp.issubdtype(b.dtype, jnp.floating))
        if a.shape != b.shape or not same_kind:
            raise ValueError(f"{where}: param {jax.tree_util.keystr(path[0])} is {b.shape} "
                             f"{b.dtype}, expected {a.shape} {a.dtype}")


class Engine:
    """Serves many agents' turns at once from one set of params. See the module docstring."""

    def __init__(self, cfg: ModelConfig, params: dict, *, num_slots: int,
                 max_context: int | None = None, mesh: Mesh | None = None,
                 steps_per_dispatch: int = 8, prefill_chunk: int = 256, page_size: int = 16,
                 detokenize: Callable[[list[int]], str] | None = None,
                 backend: DecodeBackend | str | None = None, kv_pages: int = MIN_PAGES,
                 max_kv_pages: int | None = None,
                 on_first_run: Callable[[float, float], None] | None = None):
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"Engine: cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.num_slots = _positive_int("num_slots", num_slots)
        self.max_context = cfg.max_context if max_context is None else \
            _positive_int("max_context", max_context)
        if self.max_context > cfg.max_context:
            raise ValueError(f"Engine: max_context={max_context} exceeds the preset's window "
                             f"cfg.max_context={cfg.max_context}")
        self.steps_per_dispatch = _positive_int("steps_per_dispatch", steps_per_dispatch)
        self.prefill_chunk = _positive_int("prefill_chunk", prefill_chunk)
        self.page_size = _positive_int("page_size", page_size)
        if detokenize is not None and not callable(detokenize):
            raise ValueError(f"Engine: detokenize={detokenize!r} must be callable")
        self.detokenize = detokenize
        self.mesh = mesh
        # (start, end) of each dispatch that compiled its program, first run included
        # (`first_run.py`): the trainer counts it as compile time, not evaluation time.
        self._run = FirstRuns(on_first_run)
        # How the params are laid out for decode (None: the platform's default).
        self.backend = backends.select(backend, mesh)
        run_cfg = backends.run_config(self.backend, cfg)
        self._setup = dev.Setup(cfg=run_cfg, mesh=mesh, max_context=self.max_context,
                                steps=self.steps_per_dispatch, page_size=self.page_size)
        self._state = None  # made by set_params, once the pool's size is known
        # The pool's size is in every program's shapes: each size it grows through compiles
        # its own prefill and decode buckets (on CPU ~10 s and ~500 memory maps of JIT code
        # each), so a run that knows its need starts at it (`kv_pages`).
        _positive_int("kv_pages", kv_pages)
        # The pool's ceiling: with one, a turn is admitted only while every running turn's
        # worst case (its context + new tokens + max_new_tokens, within the window) fits it,
        # so no dispatch runs short of pages and the pool never grows past it. Turns that do
        # not fit wait (`_admit_waiting`). None: the pool grows whenever it runs short.
        if max_kv_pages is not None:
            shards = self._setup.pool_shards
            if _positive_int("max_kv_pages", max_kv_pages) % shards:
                raise ValueError(f"Engine: max_kv_pages={max_kv_pages} must be a multiple of "
                                 f"the {shards} chips the KV pool is split over")
            if kv_pages > max_kv_pages:
                raise ValueError(f"Engine: kv_pages={kv_pages} exceeds "
                                 f"max_kv_pages={max_kv_pages}")
        self.max_kv_pages = max_kv_pages
        kv_pages = self._pool_size(kv_pages)
        if max_kv_pages is not None:
            kv_pages = min(kv_pages, max_kv_pages)
        self._pool = PagePool(self.page_size, kv_pages, self.num_slots, self._setup.pool_shards)
        self.set_params(params)
        self._lengths = np.zeros(self.num_slots, np.int64)  # host mirror of the context lengths
        self._allocated = np.zeros(self.num_slots, bool)
        self._to_reset: set[int] = set()
        self._n_moe = cfg.count("E")
        self._active: dict[int, ActiveTurn] = {}  # slot -> its turn in progress
        # slot -> the longest context its active turn may reach (the pages it may still take)
        self._reserve: dict[int, int] = {}
        self._waiting: collections.deque[Turn] = collections.deque()  # admitted in order
        self._ready: list[TurnResult] = []  # finished, not yet returned by `step`
        self._inflight: collections.deque = collections.deque()
        self._decode_next = False  # rows waited through a prefill chunk: decode first (`_step`)
        # Row buckets divisible by the axes rows are split over, so working rows stay sharded.
        split = self._setup.row_split
        self._min_rows = max(MIN_ROWS, split)
        self._min_prefill_rows = split
        # Page tables at least one column per chip of a split pool (each scans its columns).
        self._min_width = self._setup.pool_shards
        self._max_width = max(self._min_width,
                              pow2_at_least(self._pool.pages_for(self.max_context)))
        n = self.num_slots
        self.buckets = {
            "decode_rows": ladder(self._min_rows, n, DECODE_ROW_RATIO),
            "prefill_rows": ladder(self._min_prefill_rows, n, BUCKET_RATIO),
            "chunk": ladder(MIN_CHUNK, self.prefill_chunk, BUCKET_RATIO),
            "width": ladder(self._min_width, self._max_width, BUCKET_RATIO),
            "state_rows": ladder(1, n, BUCKET_RATIO),
        }
        self.stats = EngineStats()

    # ---- slots ---------------------------------------------------------------------------
    def set_params(self, params: dict) -> None:
        """Use these param arrays from the next dispatch on: read in place, or laid out once in
        the decode backend's layout (`backends.decode_params`): the only copies made."""
        check_params("set_params", params, self.cfg)
        if self._state is None:  # after `suspend`: every slot empty, at the pool's size
            self._state = dev.init_state(self._setup, self.num_slots, self._pool.num_pages)
        self._params = params
        self._run_params = backends.decode_params(self.backend, self.cfg, params)

    def suspend(self) -> None:
        """Free the device memory of the params view and of the slot state (Mamba state, KV
        pool) while no slot is allocated: the trainer's update step runs in that memory between
        rollouts (one accelerator holds both). `set_params` brings both back, every slot empty
        and the pool at the size it had."""
        if self.busy or self._allocated.any():
            raise RuntimeError("Engine.suspend: slots are allocated or turns in progress; "
                               "release every slot first")
        self._params = self._run_params = None
        self._state = None
        self._to_reset.clear()

    @property
    def suspended(self) -> bool:
        return self._state is None

    @staticmethod
    def release_programs() -> None:
        """Drop the process's compiled prefill and decode programs and the memory maps of their
        JIT code; they compile again on their next dispatch (`train.program_maps`)."""
        dev.release_programs()

    @property
    def busy(self) -> bool:
        """Some submitted turn has not been returned by `step` yet."""
        return bool(self._active or self._ready or self._waiting)

    @property
    def kv_pages(self) -> tuple[int, int]:
        """(pages held by slots, pages in the pool); one page holds `page_size` positions."""
        return self._pool.pages_in_use, self._pool.num_pages

    def allocate(self) -> int:
        """The lowest free slot, with an empty context."""
        free = np.flatnonzero(~self._allocated)
        if free.size == 0:
            raise ValueError(f"allocate: all {self.num_slots} slots are in use; release one "
                             "or build the engine with more num_slots")
        slot = int(free[0])
        self._allocated[slot] = True
        self._lengths[slot] = 0
        self._to_reset.add(slot)
        return slot

    def release(self, slot: int) -> None:
        self._check_slot("release", slot)
        self._allocated[slot] = False
        self._lengths[slot] = 0
        self._pool.release(slot)
        self._to_reset.discard(slot)

    def context_length(self, slot: int) -> int:
        self._check_slot("context_length", slot)
        return int(self._lengths[slot])

    def fork(self, slot: int, k: int) -> list[int]:
        """k new slots whose context is a copy of `slot`'s (no prefill: full pages are shared,
        the last partial page and the Mamba state copied in one device call)."""
        self._check_slot("fork", slot)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"fork: k={k!r} must be a positive int")
        free = np.flatnonzero(~self._allocated)
        if free.size < k:
            raise ValueError(f"fork: slot {slot} into k={k} needs {k} free slots, "
                             f"{free.size} are free")
        self._flush_resets()  # the source may be a fresh slot that was never emptied
        new = [int(s) for s in free[:k]]
        length = int(self._lengths[slot])
        self._make_room_to_fork(slot, length, k)
        src_pages, dst_pages = self._pool.fork(slot, new, length)
        dst = np.full(bucket(k, self.buckets["state_rows"]), self.num_slots, np.int32)
        dst[:k] = new
        n = bucket(max(1, len(dst_pages)), self.buckets["state_rows"])
        page_src, page_dst = np.zeros(n, np.int32), np.full(n, self._pool.num_pages, np.int32)
        page_src[:len(src_pages)], page_dst[:len(dst_pages)] = src_pages, dst_pages
        self._state = self._run(dev.fork, self._state, np.int32(slot), dst, page_src,
                                     page_dst, setup=self._setup)
        self._allocated[new] = True
        self._lengths[new] = length
        self.stats.forks += 1
        self.stats.state_ops += 1
        return new

    def _make_room_to_fork(self, slot: int, length: int, k: int) -> None:
        """k forks of a `length`-token context each take a copy of its partial last page (on
        chip (length // page_size) % chips), beside the pages running turns may still take
        there; grow the pool for them, or refuse past max_kv_pages."""
        if not length % self.page_size:
            return
        chip = (length // self.page_size) % self._pool.shards
        free = len(self._pool.free_by_shard[chip])
        taken = int(self._pool.wanted(self._reserve)[chip]) if self.max_kv_pages else 0
        short = max(0, k + taken - free) * self._pool.shards
        if not short:
            return
        if self.max_kv_pages is not None and self._pool.num_pages + short > self.max_kv_pages:
            raise ValueError(f"fork: slot {slot} into k={k} needs {k} free KV pages and the "
                             f"pool is at max_kv_pages={self.max_kv_pages} ({free - taken} "
                             "free for forks); release slots first")
        self._grow_pool(self._pool.num_pages + short)

    def _check_slot(self, where: str, slot) -> None:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) \
                or not 0 <= slot < self.num_slots or not self._allocated[slot]:
            raise ValueError(f"{where}: slot={slot!r} is not an allocated slot (unknown or "
                             f"released; this engine has slots 0..{self.num_slots - 1})")
        if where != "context_length" and self._in_progress(int(slot)):
            raise ValueError(f"{where}: slot={slot!r} has a turn in progress; wait for its "
                             "result from step()")

    def _flush_resets(self) -> None:
        if not self._to_reset:
            return
        ids = sorted(self._to_reset)
        idx = np.full(bucket(len(ids), self.buckets["state_rows"]), self.num_slots, np.int32)
        idx[:len(ids)] = ids
        self._state = self._run(dev.reset, self._state, idx, setup=self._setup)
        self._to_reset.clear()
        self.stats.state_ops += 1

    # ---- buckets and pages ---------------------------------------------------------------
    def _row_ids(self, slots: list[int], ladder_name: str = "decode_rows") -> np.ndarray:
        """Row ids for a dispatch over `slots`, padded to a bucket of that ladder (padding
        rows are slot id num_slots: empty, dropped)."""
        idx = np.full(bucket(len(slots), self.buckets[ladder_name]), self.num_slots, np.int32)
        idx[:len(slots)] = slots
        return idx

    def _pool_size(self, pages: int) -> int:
        """A pool size for at least `pages` pages: a power of two, a multiple of the chips the
        pool is split over."""
        shards = self._setup.pool_shards
        return -(-pow2_at_least(pages) // shards) * shards

    def _grow_pool(self, pages: int) -> None:
        target = max(self._pool.num_pages, self._pool_size(pages))
        if self.max_kv_pages is not None:
            if pages > self.max_kv_pages:  # admission and fork keep every need under it
                raise RuntimeError(f"engine: {pages} KV pages needed past "
                                   f"max_kv_pages={self.max_kv_pages}")
            target = min(target, self.max_kv_pages)
        if target > self._pool.num_pages:
            self._state = self._run(dev.grow, self._state, setup=self._setup, num_pages=target)
            self._pool.grow(target)
            self.stats.state_ops += 1
            # The pool never shrinks, so the programs compiled for its old size are dead for
            # this engine; left cached they hold their JIT code (memory maps) for the process's
            # life, and a long run reaches the kernel's map limit (vm.max_map_count, 65,530).
            dev.release_programs()

    def _page_table(self, slots: list[int], rows: int, needs: dict[int, int]) -> np.ndarray:
        """Give each slot s pages for needs[s] tokens; the rows' page tables [rows, W]."""
        short = self._pool.shortfall(needs)
        if short:
            self._grow_pool(self._pool.num_pages + short)
        for s, n in needs.items():
            self._pool.ensure(s, n)
        width = bucket(min(self._max_width, max(self._pool.pages_for(n) for n in needs.values())),
                       self.buckets["width"])
        padded = list(slots) + [-1] * (rows - len(slots))
        return self._pool.table(padded, width)

    def _install_state(self, state, lengths) -> None:
        """Benchmarks only: adopt a synthesized device state (every slot allocated, contexts of
        `lengths` tokens, slot s holding pool pages [s * w, (s + 1) * w) for w = pages /
        slots) instead of prefilling it."""
        if self._pool.shards > 1:
            raise ValueError("_install_state: the synthesized layout is for an unsplit pool")
        pages = state.cache.num_pages or self.num_slots
        w = pages // self.num_slots
        self._state = state
        self._pool = PagePool(self.page_size, pages, self.num_slots)
        self._pool.free_by_shard = [[]]
        self._pool.refs[:] = 1
        self._pool.held = [list(range(s * w, (s + 1) * w)) for s in range(self.num_slots)]
        self._allocated[:] = True
        self._lengths[:] = lengths
        self._to_reset.clear()

    # ---- serving -------------------------------------------------------------------------
    def generate(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """Run every turn to its end; results in request order (see the module docstring).
        The engine must not be serving submitted turns (use `step` for those)."""
        if self.busy:
            raise ValueError("generate: the engine is serving submitted turns; collect them "
                             "with step() until busy is False first")
        start = time.perf_counter()
        wait_before = self.stats.device_wait_seconds
        turns = self._validate(requests)
        self.stats.generate_calls += 1
        self._admit(turns)
        by_slot: dict[int, TurnResult] = {}
        while self.busy:
            for res in self._step():
                by_slot[res.slot] = res
        wait = self.stats.device_wait_seconds - wait_before
        self.stats.host_seconds += time.perf_counter() - start - wait
        return [by_slot[t.slot] for t in turns]

    def submit(self, requests: Sequence[TurnRequest]) -> None:
        """Start these turns; they join the running dispatches (results come from `step`).
        A slot may have one turn in progress at a time."""
        start = time.perf_counter()
        self._admit(self._validate(requests))
        self.stats.host_seconds += time.perf_counter() - start

    def step(self) -> list[TurnResult]:
        """One scheduling round: at most one prefill chunk or a top-up of the decode pipeline,
        and at most one fetch. Returns the turns that finished (any order; match by slot)."""
        start = time.perf_counter()
        wait_before = self.stats.device_wait_seconds
        out = self._step()
        wait = self.stats.device_wait_seconds - wait_before
        self.stats.host_seconds += time.perf_counter() - start - wait
        return out

    def _validate(self, requests) -> list[Turn]:
        turns = validate_requests(requests, allocated=self._allocated, lengths=self._lengths,
                                  vocab=self.cfg.vocab_size,
                                  can_detokenize=self.detokenize is not None)
        for t in turns:
            if self._in_progress(t.slot):
                raise ValueError(f"submit: request {t.index} (slot {t.slot}): slot={t.slot}: "
                                 "has a turn in progress; wait for its result from step()")
        return turns

    def _in_progress(self, slot: int) -> bool:
        return slot in self._active or any(t.slot == slot for t in self._waiting)

    def _admit(self, turns: list[Turn]) -> None:
        for t in turns:
            if self._lengths[t.slot] + len(t.new_tokens) > self.max_context:
                self._ready.append(self._empty_result(t, StopReason.CONTEXT_FULL))
            else:
                self._waiting.append(t)
        self._admit_waiting()
        waiting = {id(t) for t in self._waiting}
        self.stats.turns_deferred += sum(id(t) in waiting for t in turns)

    def _worst(self, t: Turn) -> int:
        """The longest context turn t may leave its slot with."""
        return int(min(self._lengths[t.slot] + len(t.new_tokens) + t.max_new_tokens,
                       self.max_context))

    def _fits(self, slot: int, tokens: int) -> bool:
        """Whether the pool (grown up to max_kv_pages) holds every running turn's worst case
        and `tokens` positions for `slot`."""
        if self.max_kv_pages is None:
            return True
        short = self._pool.shortfall({**self._reserve, slot: tokens})
        return self._pool.num_pages + short <= self.max_kv_pages

    def _admit_waiting(self) -> None:
        """Start waiting turns in submission order while their worst case fits the pool. One
        that does not fit waits for running turns to end (their unused pages come back); with
        none running, the pool is full of idle contexts, and the turn runs with the room there
        is: fewer new tokens (ending CONTEXT_FULL), or none if its prompt does not fit."""
        start = []
        while self._waiting:
            t = self._waiting[0]
            capped = False
            if not self._fits(t.slot, self._worst(t)):
                if self._active:
                    break
                room = self._room(t)
                if room is None:
                    self._waiting.popleft()
                    self._ready.append(self._empty_result(t, StopReason.POOL_FULL))
                    continue
                t, capped = dataclasses.replace(t, max_new_tokens=room), True
            self._waiting.popleft()
            self.stats.turns_cut_by_pool += capped
            self._reserve[t.slot] = self._worst(t)
            a = self._active[t.slot] = ActiveTurn(turn=t, capped=capped)
            if not a.feeding:
                start.append(a)
        if start:
            self._start_decode(start)

    def _room(self, t: Turn) -> int | None:
        """The most new tokens turn t can sample with the pages the pool can still give it, or
        None if not even its new tokens fit (or it has none and can sample nothing)."""
        base = int(self._lengths[t.slot]) + len(t.new_tokens)
        if not self._fits(t.slot, base):
            return None
        lo, hi = 0, t.max_new_tokens  # fits(base + lo) holds, fits(base + hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._fits(t.slot, base + mid) else (lo, mid)
        return None if lo == 0 and not len(t.new_tokens) else lo

    def _step(self) -> list[TurnResult]:
        self._flush_resets()
        if self._waiting:
            self._admit_waiting()
        feeding = [a for a in self._active.values() if a.feeding]
        dispatched = prefilled = False
        if feeding and not self._decode_next:
            # Rows that could sample and wait through this chunk sample before the next one, so
            # turns arriving all the time (many rollouts in flight) cannot hold them still; rows
            # that become ready in this chunk wait for the rest of their batch's prompts, so
            # turns submitted together still decode together.
            self._decode_next = any(a.decoding and not a.ended and a.cut is None
                                    for a in self._active.values())
            self._prefill_chunk(feeding)
            prefilled = True
        else:
            self._decode_next = False
            while len(self._inflight) < PIPELINE_DEPTH and self._dispatch_decode():
                dispatched = True
            if feeding and not dispatched:  # nothing could sample after all: absorb instead
                self._prefill_chunk(feeding)
                prefilled = True
        if self._inflight and (prefilled or not dispatched
                               or len(self._inflight) >= PIPELINE_DEPTH):
            self._process(self._inflight.popleft())
        for a in [a for a in self._active.values() if a.ended and not a.inflight]:
            self._finish(a)
        out, self._ready = self._ready, []
        return out

    # ---- prefill -------------------------------------------------------------------------
    def _run_prefill(self, feed: dict[int, np.ndarray], replay: dict | None):
        """One prefill dispatch: feed[slot] (int32 [n <= prefill_chunk]) appended to each slot.
        replay[slot] ([n, m, k]) replays experts. Returns (Record, rows' slots)."""
        slots = list(feed)
        # Prefill buckets start at one row (the slot axes under a mesh): a turn admitted alone
        # into a running generation is prefilled alone, not with 7 padding rows.
        idx = self._row_ids(slots, "prefill_rows")
        rows = len(idx)
        T = bucket(max(map(len, feed.values())), self.buckets["chunk"])
        tokens = np.zeros((rows, T), np.int32)
        num_new = np.zeros(rows, np.int32)
        routing = None if replay is None else \
            np.zeros((self._n_moe, rows, T, self.cfg.num_experts_per_tok), np.int32)
        needs = {}
        for r, s in enumerate(slots):
            part = feed[s]
            tokens[r, :len(part)] = part
            num_new[r] = len(part)
            needs[s] = int(self._lengths[s]) + len(part)
            if routing is not None:
                routing[:, r, :len(part)] = replay[s].transpose(1, 0, 2)
        pages = self._page_table(slots, rows, needs)
        t0 = time.perf_counter()
        self._state, experts = self._run(dev.prefill, self._run_params, self._state, idx, pages,
                                         tokens, num_new, routing, setup=self._setup)
        self.stats.prefill_seconds += time.perf_counter() - t0
        self.stats.prefill_dispatches += 1
        for s in slots:
            self._lengths[s] += len(feed[s])
        return Record(experts, self._fetch), slots

    def _prefill_chunk(self, feeding: list[ActiveTurn]) -> None:
        need = min(self.prefill_chunk, max(len(a.turn.new_tokens) - a.fed for a in feeding))
        rows = bucket(len(feeding), self.buckets["prefill_rows"])
        take = chunk_take(need, self.buckets["chunk"], -(-PREFILL_DISPATCH_WORK // rows))
        feed = {a.slot: a.turn.new_tokens[a.fed:a.fed + take] for a in feeding}
        rec, slots = self._run_prefill(feed, None)
        done = []
        for r, a in enumerate(feeding):
            n = len(feed[a.slot])
            a.prefill_parts.append((rec, r, n))
            a.fed += n
            self.stats.prefill_tokens += n
            if not a.feeding:
                done.append(a)
        if done:
            self._start_decode(done)

    def _start_decode(self, turns: list[ActiveTurn]) -> None:
        """The turns' new tokens are absorbed: arm the ones that sample, end the others."""
        armed = []
        for a in turns:
            a.after_prefill = int(self._lengths[a.slot])
            if a.turn.max_new_tokens > 0 and a.after_prefill < self.max_context:
                a.decoding = True
                armed.append(a)
            else:
                a.ended = True
                a.reason = dev.CODE_LENGTH if a.turn.max_new_tokens == 0 else \
                    dev.CODE_CONTEXT_FULL
        if not armed:
            return
        slots = [a.slot for a in armed]
        idx = self._row_ids(slots)
        remaining = np.zeros(len(idx), np.int32)
        remaining[:len(armed)] = [a.turn.max_new_tokens for a in armed]
        self._state = self._run(dev.arm, self._state, idx, idx < self.num_slots, remaining,
                                setup=self._setup)
        self.stats.state_ops += 1
        stringy = [a for a in armed if a.turn.stop_strings]
        if stringy:
            sidx = self._row_ids([a.slot for a in stringy])
            snap = self._run(dev.snapshot, self._state, sidx, setup=self._setup)
            self.stats.state_ops += 1
            for r, a in enumerate(stringy):
                a.snap = (snap, sidx, r)

    # ---- decode --------------------------------------------------------------------------
    def _dispatch_decode(self) -> bool:
        """One decode dispatch over the turns that may still sample; False if there are none."""
        S = self.steps_per_dispatch
        turns = []
        for a in self._active.values():
            if not a.decoding or a.ended or a.cut is not None:
                continue
            ahead = S * a.inflight  # tokens the in-flight dispatches may still emit
            if a.emitted + ahead < a.turn.max_new_tokens and \
                    self._lengths[a.slot] + ahead < self.max_context:
                turns.append(a)
        if not turns:
            return False
        slots = [a.slot for a in turns]
        idx = self._row_ids(slots)
        R = len(idx)
        needs = {a.slot: int(min(self._lengths[a.slot] + S * (a.inflight + 1),
                                 self._reserve[a.slot])) for a in turns}
        pages = self._page_table(slots, R, needs)
        knobs, stops = self._knobs(turns, R)
        t0 = time.perf_counter()
        self._state, out = self._run(dev.decode, self._run_params, self._state, idx, pages,
                                     knobs, stops, setup=self._setup)
        self.stats.decode_seconds += time.perf_counter() - t0
        self.stats.decode_dispatches += 1
        self.stats.decode_rows += len(turns)
        self.stats.decode_row_slots += R
        for a in turns:
            a.inflight += 1
        self._inflight.append((Record(out.routing, self._fetch, small=out.replace(routing=None)),
                               turns))
        return True

    def _knobs(self, turns: list[ActiveTurn], R: int):
        temperature, top_p = np.ones(R, np.float32), np.ones(R, np.float32)
        top_k, seed = np.zeros(R, np.int32), np.zeros(R, np.uint32)
        greedy = np.ones(R, bool)
        width = pow2_at_least(max([len(a.turn.stop_tokens) for a in turns] + [1]))
        stops = np.full((R, width), -1, np.int32)
        for r, a in enumerate(turns):
            s = a.turn.sampling
            temperature[r], top_p[r], top_k[r] = s.temperature, s.top_p, s.top_k
            greedy[r], seed[r] = s.greedy, s.seed
            stops[r, :len(a.turn.stop_tokens)] = a.turn.stop_tokens
        knobs = SamplingKnobs(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                              seed=seed)
        return knobs, stops

    def _process(self, item) -> None:
        """Take one decode dispatch's tokens into its turns."""
        rec, turns = item
        o = self._fetch(rec.small)
        rec.small = None
        for r, a in enumerate(turns):
            a.inflight -= 1
            if a.ended or a.cut is not None:
                continue  # ran ahead past its end: the device left it untouched (or cut)
            sel = o.emitted[:, r]
            count = int(sel.sum())
            if not count:
                continue
            new = o.tokens[sel, r]
            start = a.emitted
            a.tokens.append(new)
            a.logprobs.append(o.logprobs[sel, r])
            a.decode_parts.append((rec, r, sel))
            a.emitted += count
            self._lengths[a.slot] += count
            if a.turn.stop_strings:
                j = find_stop_string(list(a.sampled()), start, a.turn.stop_strings,
                                     self.detokenize)
                if j is not None:
                    a.cut, a.ended, a.reason = j, True, dev.CODE_STOP
                    continue
            code = int(o.code[:, r].max())  # a row ends at one step at most
            if code:
                a.ended, a.reason = True, code

    def _finish(self, a: ActiveTurn) -> None:
        if a.cut is not None and a.cut + 1 < a.emitted:
            self._reabsorb(a)
        del self._active[a.slot]
        del self._reserve[a.slot]
        if a.capped and a.reason == dev.CODE_LENGTH:
            a.reason = dev.CODE_CONTEXT_FULL  # it stopped where the pool ran out, not at its limit
        self.stats.decode_tokens += a.kept()
        self._ready.append(a.result(int(self._lengths[a.slot]), self._n_moe,
                                    self.cfg.num_experts_per_tok, self._setup.routing_dtype))

    def _reabsorb(self, a: ActiveTurn) -> None:
        """A stop string cut the turn after the device absorbed tokens past the cut: restore
        the row's post-prefill Mamba state and re-absorb the kept tokens, replaying their
        experts."""
        snap, sidx, r = a.snap
        only = np.full(len(sidx), self.num_slots, np.int32)
        only[r] = a.slot
        self._state = self._run(dev.restore, self._state, only, snap, setup=self._setup)
        self.stats.state_ops += 1
        self._lengths[a.slot] = a.after_prefill
        n = a.kept()
        kept = a.sampled()[:n]
        routing = a.decoded_routing(n) if self._n_moe else None
        for off in range(0, n, self.prefill_chunk):
            part = {a.slot: kept[off:off + self.prefill_chunk]}
            replay = None if routing is None else \
                {a.slot: routing[off:off + self.prefill_chunk].astype(np.int32)}
            self._run_prefill(part, replay)

    def _empty_result(self, t: Turn, reason: StopReason) -> TurnResult:
        routing = None if not self._n_moe else np.zeros(
            (0, self._n_moe, self.cfg.num_experts_per_tok), self._setup.routing_dtype)
        return TurnResult(slot=t.slot, tokens=np.zeros(0, np.int32),
                          logprobs=np.zeros(0, np.float32), routing=routing, stop_reason=reason,
                          n_in_new=0, context_length=int(self._lengths[t.slot]))

    def _fetch(self, tree):
        t0 = time.perf_counter()
        out = jax.device_get(tree)
        self.stats.device_wait_seconds += time.perf_counter() - t0
        return out
