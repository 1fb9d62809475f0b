"""One `Engine.generate` call: its admitted turns as the rows of a working state.

`TurnBatch(engine, turns).run()` does steps 2-5 of the engine's docstring (prefill, decode,
stop-string re-absorb, write-back) and builds the results. It reads and updates the engine's
device state, host length mirror and stats; it holds no state beyond the call.
"""

from __future__ import annotations

import collections

import numpy as np

from avalon.inference import device as dev
from avalon.inference.api import StopReason, TurnResult
from avalon.inference.requests import Turn, find_stop_string
from avalon.inference.sampling import SamplingKnobs

PIPELINE_DEPTH = 2  # decode dispatches in flight
_REASONS = {dev.CODE_STOP: StopReason.STOP, dev.CODE_LENGTH: StopReason.LENGTH,
            dev.CODE_CONTEXT_FULL: StopReason.CONTEXT_FULL}


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class TurnBatch:
    """One generate call's admitted turns, as rows of a working state."""

    def __init__(self, engine, turns: list[Turn]):
        self.e = engine
        self.turns = turns
        n, slots = len(turns), engine.num_slots
        self.rows = engine._rows_for(n)
        self.gathered = self.rows < slots
        if self.gathered:
            self.row_of = list(range(n))
            self.idx = np.full(self.rows, slots, np.int32)
            self.idx[:n] = [t.slot for t in turns]
            self.lengths = np.zeros(self.rows, np.int64)
            self.lengths[:n] = engine._lengths[self.idx[:n]]
        else:  # every slot is a row: the working state is the whole state
            self.row_of = [t.slot for t in turns]
            self.idx = np.arange(slots, dtype=np.int32)
            self.lengths = engine._lengths.copy()
        R = self.rows
        self.n_in = np.zeros(R, np.int64)
        self.max_new = np.zeros(R, np.int64)
        is_turn = np.zeros(R, bool)
        for t, r in zip(turns, self.row_of):
            self.n_in[r] = len(t.new_tokens)
            self.max_new[r] = t.max_new_tokens
            is_turn[r] = True
        self.after_prefill = self.lengths + self.n_in
        # Sample only where asked and where the window has room for the sampled token.
        self.live0 = is_turn & (self.max_new > 0) & (self.after_prefill < engine.max_context)
        self.reason = np.where(self.max_new > 0, dev.CODE_CONTEXT_FULL, dev.CODE_LENGTH)
        self.emitted = np.zeros(R, np.int64)
        self.cut: dict[int, int] = {}  # row -> index of the token that completed a stop string

    # -- steps -----------------------------------------------------------------------------
    def run(self) -> list[TurnResult]:
        e, S = self.e, self.e.steps_per_dispatch
        tail = np.where(self.live0, np.minimum(self.after_prefill + S, e.max_context),
                        self.after_prefill)
        cap = e._capacity_for(int(tail.max()))
        if self.gathered:
            work = dev.gather(e._state, self.idx, setup=e._setup, capacity=cap)
            e.stats.state_ops += 1
        else:
            work, e._state = e._state, None  # donated below, written back at the end
            if dev.kv_capacity(work) not in (None, cap):
                work = dev.resize(work, setup=e._setup, capacity=cap)
                e.stats.state_ops += 1

        feed = {r: t.new_tokens for t, r in zip(self.turns, self.row_of) if len(t.new_tokens)}
        chunks, prefill_parts = [], {}
        if feed:
            work, chunks, prefill_parts = self._prefill(work, feed, None)
            e.stats.prefill_tokens += int(sum(len(v) for v in feed.values()))
        self.lengths = self.after_prefill.copy()

        outs = []
        if self.live0.any():
            snap = None
            if any(t.stop_strings for t, r in zip(self.turns, self.row_of) if self.live0[r]):
                snap = dev.snapshot(work, setup=e._setup)
                e.stats.state_ops += 1
            work, outs = self._decode(work)
            work = self._reabsorb(work, outs, snap)

        if self.gathered:
            if (dev.kv_capacity(work) or 0) > (dev.kv_capacity(e._state) or 0):
                e._state = dev.resize(e._state, setup=e._setup, capacity=dev.kv_capacity(work))
                e.stats.state_ops += 1
            e._state = dev.scatter(e._state, self.idx, work, setup=e._setup)
            e.stats.state_ops += 1
        else:
            e._state = work
        for t, r in zip(self.turns, self.row_of):
            e._lengths[t.slot] = self.lengths[r]
        return self._results(outs, e._fetch(chunks), prefill_parts)

    def _grow(self, work, need: int):
        cap = self.e._capacity_for(need)
        if dev.kv_capacity(work) is not None and cap > dev.kv_capacity(work):
            work = dev.resize(work, setup=self.e._setup, capacity=cap)
            self.e.stats.state_ops += 1
        return work

    def _prefill(self, work, feed: dict, replay_routing: dict | None):
        """Absorb feed[r] (int32 [n]) into row r, one dispatch per chunk for all rows.
        replay_routing[r] ([n, m, k]) replays experts. Returns (work, routing chunks (device),
        {r: [(chunk index, tokens of r in it)]})."""
        e, R = self.e, self.rows
        counts = np.zeros(R, np.int64)
        for r, toks in feed.items():
            counts[r] = len(toks)
        chunks, parts = [], {r: [] for r in feed}
        step = e._prefill_step(R, dev.kv_capacity(work) or 0)
        for off in range(0, int(counts.max()), step):
            n_c = np.clip(counts - off, 0, step)
            T = e._chunk_for(int(n_c.max()), step)
            tokens = np.zeros((R, T), np.int32)
            replay = None
            if replay_routing is not None:
                replay = np.zeros((e._n_moe, R, T, e.cfg.num_experts_per_tok), np.int32)
            for r, toks in feed.items():
                part = toks[off:off + n_c[r]]
                tokens[r, :len(part)] = part
                if replay is not None:
                    replay[:, r, :len(part)] = replay_routing[r][off:off + len(part)] \
                        .transpose(1, 0, 2)
                if len(part):
                    parts[r].append((len(chunks), len(part)))
            work, experts = dev.prefill(e._params, work, tokens, n_c.astype(np.int32), replay,
                                        setup=e._setup)
            e.stats.prefill_dispatches += 1
            chunks.append(experts)
        return work, chunks, parts

    def _knobs(self):
        R = self.rows
        temperature, top_p = np.ones(R, np.float32), np.ones(R, np.float32)
        top_k, seed = np.zeros(R, np.int32), np.zeros(R, np.uint32)
        greedy = np.ones(R, bool)
        width = pow2_at_least(max([len(t.stop_tokens) for t in self.turns] + [1]))
        stops = np.full((R, width), -1, np.int32)
        for t, r in zip(self.turns, self.row_of):
            s = t.sampling
            temperature[r], top_p[r], top_k[r] = s.temperature, s.top_p, s.top_k
            greedy[r], seed[r] = s.greedy, s.seed
            stops[r, :len(t.stop_tokens)] = t.stop_tokens
        knobs = SamplingKnobs(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                              seed=seed)
        return knobs, stops

    def _decode(self, work):
        """Decode dispatches until every row ended. Two dispatches are kept in flight, so the
        host handles dispatch k's results while the device runs k + 1; stop tokens, lengths
        and the window are decided on device, so running ahead never changes a result (rows
        a stop string ends on the host are halted one dispatch later and re-absorbed after)."""
        e, S = self.e, self.e.steps_per_dispatch
        knobs, stops = self._knobs()
        strings = {r: t.stop_strings for t, r in zip(self.turns, self.row_of) if t.stop_strings}
        sampled = {r: [] for r in strings}  # the turn's tokens so far, for stop strings
        live, remaining, knobs, stops = dev.put_rows(
            e._setup, (self.live0, self.max_new.astype(np.int32), knobs, stops))
        host_live, halt = self.live0.copy(), np.zeros(self.rows, bool)
        outs, inflight = [], collections.deque()
        while True:
            while len(inflight) < PIPELINE_DEPTH:
                ahead = S * len(inflight)  # tokens the in-flight dispatches may still emit
                may_run = host_live & (self.emitted + ahead < self.max_new) \
                    & (self.lengths + ahead < e.max_context)
                if not may_run.any():
                    break
                work = self._grow(work, int(min(self.lengths[host_live].max() + ahead + S,
                                                e.max_context)))
                work, live, remaining, out = dev.decode(
                    e._params, work, live, remaining, dev.put_rows(e._setup, halt), knobs,
                    stops, setup=e._setup)
                e.stats.decode_dispatches += 1
                inflight.append(out)
            if not inflight:
                return work, outs
            o = e._fetch(inflight.popleft())
            outs.append(o)
            count = o.emitted.sum(axis=0)
            self.lengths += count
            self.emitted += count
            code = o.code.max(axis=0)  # a row ends at one step at most
            for r, strs in strings.items():
                if not host_live[r] or not count[r]:
                    continue
                toks = sampled[r]
                start = len(toks)
                toks.extend(int(x) for x in o.tokens[o.emitted[:, r], r])
                j = find_stop_string(toks, start, strs, e.detokenize)
                if j is not None:
                    self.cut[r] = j
                    halt[r] = True
                    host_live[r] = False
            ended = host_live & (code != 0)
            self.reason[ended] = code[ended]
            host_live &= ~ended
            for r in self.cut:
                self.reason[r] = dev.CODE_STOP

    def _reabsorb(self, work, outs, snap):
        """Rows cut by a stop string absorbed tokens past the cut: restore their post-prefill
        Mamba state and re-absorb the kept tokens, replaying their experts."""
        redo = {r: j + 1 for r, j in self.cut.items() if j + 1 < self.emitted[r]}
        if not redo:
            return work
        e = self.e
        mask = np.zeros(self.rows, bool)
        mask[list(redo)] = True
        work = dev.restore(work, snap, mask, setup=e._setup)
        e.stats.state_ops += 1
        self.lengths[mask] = self.after_prefill[mask]
        tokens, emitted = _stack(outs, "tokens"), _stack(outs, "emitted")
        routing = _stack(outs, "routing") if e._n_moe else None
        feed, replay = {}, {} if e._n_moe else None
        for r, n in redo.items():
            sel = emitted[:, r]
            feed[r] = tokens[sel, r][:n]
            if replay is not None:
                replay[r] = routing[sel, :, r][:n].astype(np.int32)
        work, _, _ = self._prefill(work, feed, replay)
        for r, n in redo.items():
            self.lengths[r] += n
        return work

    def _results(self, outs, chunks, prefill_parts) -> list[TurnResult]:
        e = self.e
        if outs:
            tokens, emitted = _stack(outs, "tokens"), _stack(outs, "emitted")
            logprobs = _stack(outs, "logprobs")
            routing = _stack(outs, "routing") if e._n_moe else None
        results = []
        for t, r in zip(self.turns, self.row_of):
            n = self.cut[r] + 1 if r in self.cut else int(self.emitted[r])
            if n:
                sel = emitted[:, r]
                toks, lps = tokens[sel, r][:n], logprobs[sel, r][:n]
            else:
                toks, lps = np.zeros(0, np.int32), np.zeros(0, np.float32)
            used = None
            if e._n_moe:
                pieces = [chunks[c][:, r, :k].transpose(1, 0, 2) for c, k in
                          prefill_parts.get(r, [])]
                if n:
                    pieces.append(routing[emitted[:, r], :, r][:n])
                used = np.concatenate(pieces, axis=0) if pieces else np.zeros(
                    (0, e._n_moe, e.cfg.num_experts_per_tok), e._setup.routing_dtype)
            e.stats.decode_tokens += n
            results.append(TurnResult(
                slot=t.slot, tokens=toks.astype(np.int32), logprobs=lps.astype(np.float32),
                routing=used, stop_reason=_REASONS[int(self.reason[r])],
                n_in_new=len(t.new_tokens), context_length=int(self.lengths[r])))
        return results


def _stack(outs: list, field: str) -> np.ndarray:
    """Concatenate one field of the fetched decode outputs over dispatches (axis 0 = step)."""
    return np.concatenate([getattr(o, field) for o in outs], axis=0)
