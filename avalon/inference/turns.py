"""Host-side bookkeeping of the turns an engine is serving, and of its dispatches' outputs.

An `ActiveTurn` goes feeding (its new tokens absorbed chunk by chunk) -> decoding (its slot is
a row of decode dispatches until the device or the host ends it) -> ended; it is finished once
no dispatch in flight still has its row, and then becomes a `TurnResult`.

Outputs stay on the device until needed: a decode dispatch's tokens, log-probs and end codes
are fetched when the host processes it (a few bytes per row), its routing only when the first
turn with a row in it finishes (`Record.routing`), so routing crosses to the host once per
turn batch rather than with every dispatch, in the narrowest integer type.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from avalon.inference import device as dev
from avalon.inference.api import StopReason, TurnResult
from avalon.inference.requests import Turn

REASONS = {dev.CODE_STOP: StopReason.STOP, dev.CODE_LENGTH: StopReason.LENGTH,
           dev.CODE_CONTEXT_FULL: StopReason.CONTEXT_FULL}


class Record:
    """One dispatch's outputs: `small` (fetched at once) and `routing` (fetched lazily)."""

    def __init__(self, routing_device, fetch, small=None):
        self.small = small
        self._routing_device = routing_device
        self._routing = None
        self._fetch = fetch

    def routing(self) -> np.ndarray:
        if self._routing is None:
            self._routing = self._fetch(self._routing_device)
            self._routing_device = None
        return self._routing


@dataclasses.dataclass
class ActiveTurn:
    turn: Turn
    fed: int = 0  # new tokens absorbed so far
    decoding: bool = False
    ended: bool = False
    reason: int = 0  # a dev.CODE_* once ended
    after_prefill: int = 0  # context length when decoding started
    emitted: int = 0  # tokens sampled (and absorbed) so far
    inflight: int = 0  # decode dispatches in flight that have this turn's row
    cut: int | None = None  # index of the sampled token that completed a stop string
    capped: bool = False  # max_new_tokens cut to the pages the pool had left (engine._room)
    snap: tuple | None = None  # (Snapshot, its padded slot ids, row) for stop strings
    prefill_parts: list = dataclasses.field(default_factory=list)  # (Record, row, count)
    decode_parts: list = dataclasses.field(default_factory=list)  # (Record, row, steps mask)
    tokens: list = dataclasses.field(default_factory=list)  # int32 pieces
    logprobs: list = dataclasses.field(default_factory=list)  # fp32 pieces

    @property
    def slot(self) -> int:
        return self.turn.slot

    @property
    def feeding(self) -> bool:
        return self.fed < len(self.turn.new_tokens)

    def sampled(self) -> np.ndarray:
        return np.concatenate(self.tokens) if self.tokens else np.zeros(0, np.int32)

    def kept(self) -> int:
        """Tokens the turn returns: up to the stop-string cut, if any."""
        return self.cut + 1 if self.cut is not None else self.emitted

    def decoded_routing(self, n: int) -> np.ndarray | None:
        """Routing of the first n sampled tokens [n, m, k], from the decode records."""
        pieces = [rec.routing()[sel, :, r] for rec, r, sel in self.decode_parts]
        return np.concatenate(pieces, axis=0)[:n] if pieces else None

    def result(self, context_length: int, n_moe: int, k: int, routing_dtype) -> TurnResult:
        n = self.kept()
        toks = self.sampled()[:n]
        lps = np.concatenate(self.logprobs)[:n] if self.logprobs else np.zeros(0, np.float32)
        used = None
        if n_moe:
            pieces = [rec.routing()[:, r, :c].transpose(1, 0, 2)
                      for rec, r, c in self.prefill_parts]
            if n:
                pieces.append(self.decoded_routing(n))
            used = np.concatenate(pieces, axis=0).astype(routing_dtype) if pieces else \
                np.zeros((0, n_moe, k), routing_dtype)
        return TurnResult(slot=self.slot, tokens=toks.astype(np.int32),
                          logprobs=lps.astype(np.float32), routing=used,
                          stop_reason=REASONS[self.reason], n_in_new=len(self.turn.new_tokens),
                          context_length=context_length)
