"""Host-side request handling: validating `TurnRequest`s and finding stop strings.

Caller mistakes raise `ValueError` naming the request index, the slot and the field; nothing a
model can produce raises here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np

from avalon.inference.api import SamplingParams, TurnRequest

SEED_LIMIT = 2 ** 32


@dataclasses.dataclass
class Turn:
    """A validated request: the fields the engine uses, in host types."""

    index: int  # position in the generate call (results come back in this order)
    slot: int
    new_tokens: np.ndarray  # int32 [n_in]
    max_new_tokens: int
    sampling: SamplingParams
    stop_tokens: tuple[int, ...]
    stop_strings: tuple[str, ...]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _fail(i: int, slot, field: str, value, why: str):
    shown = value if not isinstance(value, np.ndarray) else f"array{value.shape}"
    raise ValueError(f"generate: request {i} (slot {slot}): {field}={shown!r}: {why}")


def _check_sampling(i: int, slot, s) -> None:
    if not isinstance(s, SamplingParams):
        _fail(i, slot, "sampling", s, "must be a SamplingParams")
    t = s.temperature
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t <= 0:
        _fail(i, slot, "sampling.temperature", t,
              "must be a finite number > 0 (use greedy=True for argmax)")
    p = s.top_p
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
        _fail(i, slot, "sampling.top_p", p, "must be in (0, 1]; 1 turns nucleus sampling off")
    if not _is_int(s.top_k) or s.top_k < 0:
        _fail(i, slot, "sampling.top_k", s.top_k, "must be an int >= 0; 0 turns top-k off")
    if not isinstance(s.greedy, bool):
        _fail(i, slot, "sampling.greedy", s.greedy, "must be a bool")
    if not _is_int(s.seed) or not 0 <= s.seed < SEED_LIMIT:
        _fail(i, slot, "sampling.seed", s.seed, f"must be an int in [0, {SEED_LIMIT})")


def _check_tokens(i: int, slot, new_tokens, vocab: int) -> np.ndarray:
    arr = np.asarray(new_tokens)
    if arr.ndim != 1:
        _fail(i, slot, "new_tokens", new_tokens, f"must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        _fail(i, slot, "new_tokens", new_tokens, f"must hold integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        bad = int(arr[(arr < 0) | (arr >= vocab)][0])
        _fail(i, slot, "new_tokens", new_tokens,
              f"token id {bad} is outside the vocabulary [0, {vocab})")
    return arr.astype(np.int32)


def validate_requests(requests: Sequence[TurnRequest], *, allocated: np.ndarray,
                      lengths: np.ndarray, vocab: int, can_detokenize: bool) -> list[Turn]:
    """Check every request; return them as `Turn`s in the same order."""
    if isinstance(requests, TurnRequest) or not isinstance(requests, Sequence):
        raise ValueError(f"generate: requests must be a sequence of TurnRequest, got "
                         f"{type(requests).__name__}")
    turns, seen = [], {}
    for i, req in enumerate(requests):
        if not isinstance(req, TurnRequest):
            raise ValueError(f"generate: request {i} is a {type(req).__name__}, not a "
                             "TurnRequest")
        slot = req.slot
        if not _is_int(slot) or not 0 <= slot < len(allocated) or not allocated[slot]:
            _fail(i, slot, "slot", slot, "is not an allocated slot (unknown or released)")
        if slot in seen:
            _fail(i, slot, "slot", slot, f"appears twice in one call (also request {seen[slot]})")
        seen[slot] = i
        if not _is_int(req.max_new_tokens) or req.max_new_tokens < 0:
            _fail(i, slot, "max_new_tokens", req.max_new_tokens, "must be an int >= 0")
        tokens = _check_tokens(i, slot, req.new_tokens, vocab)
        if tokens.size == 0 and (req.max_new_tokens == 0 or lengths[slot] == 0):
            why = ("an empty turn with max_new_tokens=0 does nothing" if req.max_new_tokens == 0
                   else "the slot's context is empty, so there is nothing to sample from")
            _fail(i, slot, "new_tokens", req.new_tokens, why)
        _check_sampling(i, slot, req.sampling)
        stops = tuple(req.stop_tokens)
        for t in stops:
            if not _is_int(t) or not 0 <= t < vocab:
                _fail(i, slot, "stop_tokens", req.stop_tokens,
                      f"{t!r} is not a token id in [0, {vocab})")
        strings = tuple(req.stop_strings)
        for s in strings:
            if not isinstance(s, str) or not s:
                _fail(i, slot, "stop_strings", req.stop_strings,
                      f"{s!r} is not a non-empty string")
        if strings and not can_detokenize:
            _fail(i, slot, "stop_strings", req.stop_strings,
                  "stop strings need the engine to be built with detokenize=")
        turns.append(Turn(index=i, slot=int(slot), new_tokens=tokens,
                          max_new_tokens=int(req.max_new_tokens), sampling=req.sampling,
                          stop_tokens=tuple(int(t) for t in stops), stop_strings=strings))
    return turns


def stop_window(strings: Sequence[str]) -> int:
    """Tokens enough to contain any occurrence of the strings: every token that decodes to
    something carries at least one byte, and a character is at most 4 bytes."""
    return 4 * max(len(s) for s in strings) + 4


def find_stop_string(tokens: Sequence[int], start: int, strings: Sequence[str],
                     detokenize: Callable[[list[int]], str]) -> int | None:
    """Index of the first token at or after `start` whose text completes one of `strings`
    (matching only the text of `tokens`, the turn's sampled tokens), or None.

    One detokenize of the new tokens plus a look-back window answers "no match" (the common
    case); only a hit searches token by token for the completing one."""
    w = stop_window(strings)
    text = detokenize(list(tokens[max(0, start - w):]))
    if not any(s in text for s in strings):
        return None
    for j in range(start, len(tokens)):
        tail = detokenize(list(tokens[max(0, j + 1 - w):j + 1]))
        if any(s in tail for s in strings):
            return j
    return None
