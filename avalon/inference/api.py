"""The engine's request/result types: what the organisation simulator sends and gets back.

A turn = append `new_tokens` to a slot's context (only the tokens new to that agent: its n_in),
then sample until a stop token or string, `max_new_tokens`, or the context window is full.
Things a model can cause end a turn with a `StopReason`; only caller mistakes raise.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np


class StopReason(enum.Enum):
    STOP = "stop"  # a stop token or stop string was sampled
    LENGTH = "length"  # max_new_tokens reached
    CONTEXT_FULL = "context_full"  # the slot's context window (or the KV pool) is full
    # The KV pool, at `max_kv_pages` and full of other slots' contexts, had no room for the
    # turn's new tokens: nothing absorbed, nothing sampled (the caller decides what it means).
    POOL_FULL = "pool_full"


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus; 1.0 = off
    top_k: int = 0  # 0 = off
    greedy: bool = False
    seed: int = 0  # per-slot stream: the same seed and context give the same tokens


@dataclasses.dataclass
class TurnRequest:
    slot: int
    new_tokens: np.ndarray  # int32 [n_in], appended to the slot's context before sampling
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


@dataclasses.dataclass
class TurnResult:
    slot: int
    tokens: np.ndarray  # int32 [n_out] sampled (a stop token, if any, included)
    logprobs: np.ndarray  # float32 [n_out]: log softmax(logits / T) at each token, over the
    #                       whole vocabulary (no top-k/top-p renormalisation; greedy: T = 1).
    #                       The policy the trainer recomputes; see inference/sampling.py.
    routing: np.ndarray | None  # int [n_in + n_out, n_moe_layers, k]: experts used with each
    #                             token of this turn (new_tokens then tokens) as the input
    stop_reason: StopReason
    n_in_new: int  # tokens prefilled this turn: len(new_tokens), 0 if they did not fit
    context_length: int  # the slot's context length after the turn


@dataclasses.dataclass
class EngineStats:
    """Running counters of an `Engine` (never reset by the engine; diff two snapshots).

    A *dispatch* is one jitted device call that runs the model: a prefill chunk (over every
    slot with new tokens) or a decode scan (`steps_per_dispatch` tokens for every active slot).
    Bookkeeping calls that only move state (gather, scatter, resize, fork copies, resets) are
    counted apart in `state_ops`.
    """

    generate_calls: int = 0
    prefill_dispatches: int = 0  # includes the rare re-absorb after a stop string (see engine)
    decode_dispatches: int = 0
    state_ops: int = 0
    forks: int = 0
    prefill_tokens: int = 0  # real tokens absorbed by prefill (padding excluded)
    decode_tokens: int = 0  # tokens sampled and returned
    turns_deferred: int = 0  # turns that waited for KV pages (a pool at max_kv_pages)
    turns_cut_by_pool: int = 0  # turns given fewer new tokens than asked: the pool was full
    host_seconds: float = 0.0  # time inside generate not spent waiting on the device
    device_wait_seconds: float = 0.0  # time blocked on device results
    # Seconds inside prefill / decode dispatch calls, their programs' first (compiling) calls
    # included. A CPU host running executions on the calling thread (`train/cpu_memory.py`)
    # computes in them, so they are the work's time; an accelerator returns at once and its
    # work shows up as device_wait_seconds.
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_rows: int = 0  # live rows over all decode dispatches (rows / dispatch: the batch)
    decode_row_slots: int = 0  # the same with the padding rows of each dispatch's bucket

    @property
    def dispatches(self) -> int:
        return self.prefill_dispatches + self.decode_dispatches

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self)
