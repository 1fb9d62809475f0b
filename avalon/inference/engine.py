"""The slot engine: a host scheduler over one donated device state (see `device.py`).

    engine = Engine(cfg, params, num_slots=64, detokenize=tok.decode)
    a = engine.allocate()
    [r] = engine.generate([TurnRequest(slot=a, new_tokens=prompt, max_new_tokens=256)])
    rollouts = engine.fork(a, 16)          # 16 slots sharing a's context, no prefill

A slot is one agent's context. `generate` runs every request together:

1. Admission. A turn whose new tokens do not fit the window ends at once with CONTEXT_FULL
   (nothing absorbed). The other turns' slots become the rows of a working state: gathered
   into a power-of-two row bucket (padding rows are empty and dropped on the way back), or the
   whole state itself when the bucket is every slot. Its KV capacity is a power-of-two bucket
   of the longest context it must hold (never past `max_context`), grown with `resize` while
   decoding. So attention memory and reads follow the contexts in use, not slots x window.
2. Prefill: one batched call per chunk of `prefill_chunk` tokens over all rows with new tokens
   (rows right-padded to a power-of-two chunk bucket, `num_new` per row). The chunk shrinks
   when rows x heads x chunk x capacity fp32 attention scores would pass PREFILL_SCORE_BYTES
   (the cached attention path materialises them).
3. Decode: dispatches of `steps_per_dispatch` tokens over every row (one `lax.scan`). Each step
   samples from the row's last hidden state and absorbs the sampled token at once, so a turn
   returns with every token it produced in the context and `routing` covers new_tokens +
   tokens. Stop tokens, max_new_tokens and the context window are decided on device; stop
   strings on the host after each dispatch, which then halts the row. Two dispatches are kept
   in flight, so host work overlaps device work.
4. Stop strings cut a turn mid-dispatch, after the device already absorbed the tokens that
   follow the cut. The engine therefore snapshots the Mamba state (and lengths, hidden) after
   prefill when some turn has stop strings, and for a cut row restores it and re-absorbs the
   kept tokens in one batched prefill that replays the experts they were decoded with (the
   prefill takes the chunked Mamba path; KV below the cut is untouched).
5. Scatter the rows back; results in request order.

Device dispatches per call: ceil(longest new_tokens / chunk) prefills + ceil(longest turn /
steps_per_dispatch) decodes (+ at most one run-ahead decode when turns end on stop tokens, + the
stop-string re-absorb), whatever the number of requests. The host never loops over slots for
device work.

Params are read, never copied: `set_params` swaps the reference to the trainer's new arrays. If
the trainer's layout differs from the one decode wants, re-laying them out is the caller's
"switch" (measured by the RL driver); the engine uses what it is given.

Sampling and its log-probabilities: see `sampling.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from avalon.inference import device as dev
from avalon.inference.api import EngineStats, StopReason, TurnRequest, TurnResult
from avalon.inference.batch import TurnBatch, pow2_at_least
from avalon.inference.requests import Turn, validate_requests
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params

MIN_CAPACITY = 16
MIN_CHUNK = 8
MIN_ROWS = 8
# Cached attention scores one prefill chunk as [rows, heads, chunk, capacity] fp32; the chunk
# shrinks (to MIN_CHUNK at least) to keep that under this many bytes.
PREFILL_SCORE_BYTES = 1 << 30


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Engine: {name}={value!r} must be a positive int")
    return value


def _check_params(where: str, params, like) -> None:
    """params must match `like` (arrays or ShapeDtypeStructs) in structure, shapes, dtypes."""
    if jax.tree.structure(params) != jax.tree.structure(like):
        raise ValueError(f"{where}: the params' tree structure differs from the config's "
                         "(params for another config?)")
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(like), jax.tree.leaves(like),
                          jax.tree.leaves(params)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"{where}: param {jax.tree_util.keystr(path[0])} is {b.shape} "
                             f"{b.dtype}, expected {a.shape} {a.dtype}")


class Engine:
    """Serves many agents' turns at once from one set of params. See the module docstring."""

    def __init__(self, cfg: ModelConfig, params: dict, *, num_slots: int,
                 max_context: int | None = None, mesh: Mesh | None = None,
                 steps_per_dispatch: int = 8, prefill_chunk: int = 256,
                 detokenize: Callable[[list[int]], str] | None = None):
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
        if detokenize is not None and not callable(detokenize):
            raise ValueError(f"Engine: detokenize={detokenize!r} must be callable")
        self.detokenize = detokenize
        self.mesh = mesh
        self._setup = dev.Setup(cfg=cfg, mesh=mesh, max_context=self.max_context,
                                steps=self.steps_per_dispatch)
        _check_params("Engine", params, abstract_params(cfg))
        self._params = params
        self._state = dev.init_state(self._setup, self.num_slots, self._capacity_for(0))
        self._lengths = np.zeros(self.num_slots, np.int64)  # host mirror of the context lengths
        self._allocated = np.zeros(self.num_slots, bool)
        self._to_reset: set[int] = set()
        self._n_moe = cfg.count("E")
        # Row buckets divisible by the slot-sharding axes, so working states stay sharded.
        self._min_rows = MIN_ROWS if mesh is None else \
            max(MIN_ROWS, mesh.shape["data"] * mesh.shape["fsdp"])
        self.stats = EngineStats()

    # ---- slots ---------------------------------------------------------------------------
    def set_params(self, params: dict) -> None:
        """Use the trainer's new param arrays from the next dispatch on (no copy)."""
        _check_params("set_params", params, self._params)
        self._params = params

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
        self._lengths[slot] = 0  # a free slot's stale state never sets the KV capacity
        self._to_reset.discard(slot)

    def context_length(self, slot: int) -> int:
        self._check_slot("context_length", slot)
        return int(self._lengths[slot])

    def fork(self, slot: int, k: int) -> list[int]:
        """k new slots whose context is a copy of `slot`'s (one device copy, no prefill)."""
        self._check_slot("fork", slot)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"fork: k={k!r} must be a positive int")
        free = np.flatnonzero(~self._allocated)
        if free.size < k:
            raise ValueError(f"fork: slot {slot} into k={k} needs {k} free slots, "
                             f"{free.size} are free")
        self._flush_resets()  # the source may be a fresh slot that was never emptied
        new = [int(s) for s in free[:k]]
        dst = np.full(pow2_at_least(k), self.num_slots, np.int32)
        dst[:k] = new
        self._state = dev.copy_slot(self._state, np.int32(slot), dst, setup=self._setup)
        self._allocated[new] = True
        self._lengths[new] = self._lengths[slot]
        self.stats.forks += 1
        self.stats.state_ops += 1
        return new

    def _check_slot(self, where: str, slot) -> None:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) \
                or not 0 <= slot < self.num_slots or not self._allocated[slot]:
            raise ValueError(f"{where}: slot={slot!r} is not an allocated slot (unknown or "
                             f"released; this engine has slots 0..{self.num_slots - 1})")

    def _flush_resets(self) -> None:
        if not self._to_reset:
            return
        ids = sorted(self._to_reset)
        idx = np.full(pow2_at_least(len(ids)), self.num_slots, np.int32)
        idx[:len(ids)] = ids
        self._state = dev.reset(self._state, idx, setup=self._setup)
        self._to_reset.clear()
        self.stats.state_ops += 1

    # ---- buckets -------------------------------------------------------------------------
    def _capacity_for(self, n: int) -> int:
        return min(self.max_context, max(MIN_CAPACITY, pow2_at_least(n)))

    def _rows_for(self, n: int) -> int:
        return min(self.num_slots, max(self._min_rows, pow2_at_least(n)))

    def _prefill_step(self, rows: int, capacity: int) -> int:
        """Tokens per prefill chunk: `prefill_chunk`, fewer if the scores would not fit."""
        per_token = rows * self.cfg.num_attention_heads * capacity * 4 * ("*" in self.cfg.pattern)
        if per_token == 0:
            return self.prefill_chunk
        fit = 1 << max(0, (PREFILL_SCORE_BYTES // per_token).bit_length() - 1)
        return max(MIN_CHUNK, min(self.prefill_chunk, fit))

    def _chunk_for(self, n: int, step: int) -> int:
        return min(step, max(MIN_CHUNK, pow2_at_least(n)))

    def _install_state(self, state, lengths) -> None:
        """Benchmarks only: adopt a synthesized device state (every slot allocated, contexts of
        `lengths` tokens) instead of prefilling it."""
        self._state = state
        self._allocated[:] = True
        self._lengths[:] = lengths
        self._to_reset.clear()

    # ---- generate ------------------------------------------------------------------------
    def generate(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """Run every turn together; results in request order (see the module docstring)."""
        start = time.perf_counter()
        wait_before = self.stats.device_wait_seconds
        turns = validate_requests(requests, allocated=self._allocated, lengths=self._lengths,
                                  vocab=self.cfg.vocab_size,
                                  can_detokenize=self.detokenize is not None)
        self.stats.generate_calls += 1
        results: list[TurnResult | None] = [None] * len(turns)
        admitted = []
        for t in turns:
            if self._lengths[t.slot] + len(t.new_tokens) > self.max_context:
                results[t.index] = self._empty_result(t, StopReason.CONTEXT_FULL)
            else:
                admitted.append(t)
        if admitted:
            self._flush_resets()
            for t, res in zip(admitted, TurnBatch(self, admitted).run()):
                results[t.index] = res
        wait = self.stats.device_wait_seconds - wait_before
        self.stats.host_seconds += time.perf_counter() - start - wait
        return results

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
