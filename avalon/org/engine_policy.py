"""The model as a policy: every turn of a tick goes to the engine in one `generate` call.

Slots: each (rollout, agent) gets an engine slot at its first turn and keeps it for one context
segment; a new segment (compaction rebuilt the context) releases the slot and takes a fresh one,
since the engine's context must equal the agent's. `release(key)` frees the slot for good.
Only `Turn.new_tokens` (the agent's n_in) are sent; the engine keeps the rest.

Prefix sharing: `prefill_shared(keys, prefix)` prefills `prefix` once (a prefill-only turn,
`max_new_tokens=0`) and forks the slot for the other keys; each key's first turn then sends
only what follows the prefix, and its routing is completed with the prefix's.

The engine must have a slot for every agent alive at once (at most the number of rollouts x
(1 + budget)), and the model's vocabulary must cover the tokenizer's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from avalon.inference.api import SamplingParams, TurnRequest
from avalon.org.agents import AgentKey
from avalon.org.policy import Turn, TurnOutput
from avalon.tokenizer.chat import ChatFormat

DEFAULT_SAMPLING = SamplingParams()


@dataclasses.dataclass
class _Slot:
    slot: int
    segment: int
    prefix: np.ndarray | None = None  # tokens already in the slot before its first turn
    prefix_routing: np.ndarray | None = None


class EnginePolicy:
    """Adapts the slot engine (`avalon/inference/engine.py`) to the `Policy` interface."""

    def __init__(self, engine, chat: ChatFormat, sampling: SamplingParams = DEFAULT_SAMPLING,
                 *, max_new_tokens: int | None = None):
        """`max_new_tokens`: an optional cap below the organisation's per-turn limit (shorter
        sampled turns for evaluation or throughput budgets)."""
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"EnginePolicy max_new_tokens must be >= 1, got {max_new_tokens}")
        self.engine = engine
        self.end_id = chat.end_id
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self._slots: dict[AgentKey, _Slot] = {}

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        if not keys:
            return
        for key in keys:
            if key in self._slots:
                raise ValueError(f"prefill_shared: {key} already has a slot")
        prefix = np.asarray(prefix, np.int32)
        src = self.engine.allocate()
        [res] = self.engine.generate([TurnRequest(slot=src, new_tokens=prefix, max_new_tokens=0,
                                                  sampling=self.sampling,
                                                  stop_tokens=(self.end_id,))])
        slots = [src] + (list(self.engine.fork(src, len(keys) - 1)) if len(keys) > 1 else [])
        for key, slot in zip(keys, slots, strict=True):
            self._slots[key] = _Slot(slot, 0, prefix, res.routing)

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        requests, prefix_routing = [], []
        for t in turns:
            s = self._slots.get(t.key)
            if s is not None and s.segment != t.segment:
                self.engine.release(s.slot)
                s = None
            if s is None:
                s = self._slots[t.key] = _Slot(self.engine.allocate(), t.segment)
            new = np.asarray(t.new_tokens, np.int32)
            routing = None
            if s.prefix is not None:
                n = len(s.prefix)
                if len(new) < n or not np.array_equal(new[:n], s.prefix):
                    raise ValueError(f"{t.key}: first turn does not start with the shared prefix")
                new, routing = new[n:], s.prefix_routing
                s.prefix = s.prefix_routing = None
            prefix_routing.append(routing)
            limit = t.max_new_tokens if self.max_new_tokens is None else min(
                t.max_new_tokens, self.max_new_tokens)
            requests.append(TurnRequest(
                slot=s.slot, new_tokens=new, max_new_tokens=limit,
                sampling=dataclasses.replace(self.sampling, seed=t.seed),
                stop_tokens=(self.end_id,)))
        results = self.engine.generate(requests) if requests else []
        if len(results) != len(requests):
            raise RuntimeError(f"engine returned {len(results)} results for {len(requests)}")
        out = []
        for req, res, pre in zip(requests, results, prefix_routing):
            if res.slot != req.slot:
                raise RuntimeError(f"engine result for slot {res.slot}, request was {req.slot}")
            if res.n_in_new != len(req.new_tokens):
                raise RuntimeError(f"engine absorbed {res.n_in_new} of {len(req.new_tokens)} "
                                   f"prompt tokens in slot {req.slot}: its max_context is "
                                   "smaller than the organisation's window")
            routing = res.routing
            if pre is not None and routing is not None:
                routing = np.concatenate([pre, routing], axis=0)
            out.append(TurnOutput(tokens=np.asarray(res.tokens, np.int32),
                                  logprobs=np.asarray(res.logprobs, np.float32),
                                  routing=routing, stop=res.stop_reason))
        return out

    def release(self, key: AgentKey) -> None:
        s = self._slots.pop(key, None)
        if s is not None:
            self.engine.release(s.slot)
