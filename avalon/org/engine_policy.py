"""The model as a policy: every turn of a tick goes to the engine in one `generate` call, or,
fed continuously (`submit` / `collect`, `RolloutDriver(continuous=True)`), each rollout's batch
joins the running engine (`Engine.submit` / `Engine.step`) as soon as that rollout is ready.

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

from avalon.inference.api import SamplingParams, StopReason, TurnRequest
from avalon.org.policy import AgentKey, Turn, TurnOutput
from avalon.tokenizer.chat import ChatFormat

DEFAULT_SAMPLING = SamplingParams()


@dataclasses.dataclass
class _Slot:
    slot: int
    segment: int
    prefix: np.ndarray | None = None  # tokens already in the slot before its first turn
    prefix_routing: np.ndarray | None = None


@dataclasses.dataclass
class _Batch:
    built: list  # (TurnRequest, prefix routing or None) per turn, in turn order
    results: dict = dataclasses.field(default_factory=dict)  # slot -> TurnResult

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.built)


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
        self._batches: dict[int, _Batch] = {}  # submitted, not yet collected (submission order)
        self._tag_of: dict[int, int] = {}  # engine slot -> its running turn's batch

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        if not keys:
            return
        for key in keys:
            if key in self._slots:
                raise ValueError(f"prefill_shared: {key} already has a slot")
        prefix = np.asarray(prefix, np.int32)
        src = self.engine.allocate()
        res = self._run_alone(TurnRequest(slot=src, new_tokens=prefix, max_new_tokens=0,
                                          sampling=self.sampling, stop_tokens=(self.end_id,)))
        slots = [src] + (list(self.engine.fork(src, len(keys) - 1)) if len(keys) > 1 else [])
        for key, slot in zip(keys, slots, strict=True):
            self._slots[key] = _Slot(slot, 0, prefix, res.routing)

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        built = [self._request(t) for t in turns]
        requests = [r for r, _ in built]
        results = self.engine.generate(requests) if requests else []
        if len(results) != len(requests):
            raise RuntimeError(f"engine returned {len(results)} results for {len(requests)}")
        return [self._output(req, res, pre) for (req, pre), res in zip(built, results)]

    # ---- continuous feeding (`StreamingPolicy`) ----------------------------------------------
    def submit(self, tag: int, turns: Sequence[Turn]) -> None:
        """Start one rollout's batch in the running engine (`Engine.submit`): it joins the
        dispatches of the batches already running."""
        if tag in self._batches:
            raise ValueError(f"submit: batch {tag} is still running")
        built = [self._request(t) for t in turns]
        self._batches[tag] = _Batch(built)
        for req, _ in built:
            self._tag_of[req.slot] = tag
        self.engine.submit([req for req, _ in built])

    def collect(self) -> list[tuple[int, list[TurnOutput]]]:
        """Step the engine until some submitted batch has every result; return the done ones
        in submission order."""
        if not self._batches:
            raise ValueError("collect: no batch was submitted")
        while not any(b.done for b in self._batches.values()):
            self._step_engine()
        out = []
        for tag in [tag for tag, b in self._batches.items() if b.done]:
            b = self._batches.pop(tag)
            out.append((tag, [self._output(req, b.results[req.slot], pre)
                              for req, pre in b.built]))
        return out

    def _step_engine(self) -> list:
        """One `Engine.step`; results of submitted batches are filed under their batch, the
        others returned."""
        if not self.engine.busy:
            raise RuntimeError("engine policy: batches are outstanding but the engine is idle")
        loose = []
        for res in self.engine.step():
            tag = self._tag_of.pop(res.slot, None)
            if tag is None:
                loose.append(res)
            else:
                self._batches[tag].results[res.slot] = res
        return loose

    def _run_alone(self, request: TurnRequest):
        """One turn to its end: `generate` when nothing runs, else through the running engine
        (other batches' results are filed as they come)."""
        if not self._batches:
            [res] = self.engine.generate([request])
            return res
        self.engine.submit([request])
        while True:
            for res in self._step_engine():
                if res.slot == request.slot:
                    return res

    # ---- requests and outputs ----------------------------------------------------------------
    def _request(self, t: Turn) -> tuple[TurnRequest, np.ndarray | None]:
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
        limit = t.max_new_tokens if self.max_new_tokens is None else min(
            t.max_new_tokens, self.max_new_tokens)
        return TurnRequest(slot=s.slot, new_tokens=new, max_new_tokens=limit,
                           sampling=dataclasses.replace(self.sampling, seed=t.seed),
                           stop_tokens=(self.end_id,)), routing

    @staticmethod
    def _output(req: TurnRequest, res, pre: np.ndarray | None) -> TurnOutput:
        if res.slot != req.slot:
            raise RuntimeError(f"engine result for slot {res.slot}, request was {req.slot}")
        if res.stop_reason is StopReason.POOL_FULL:
            # The engine's KV pool (at max_kv_pages) had no room for the prompt: nothing was
            # absorbed or sampled. The organisation counts the turn as refused and stops the
            # agent. The prompt's routing is never replayed into a loss (no sampled token
            # follows it in the row): zeros of its length keep the row's routing aligned.
            n = len(req.new_tokens) + (0 if pre is None else len(pre))
            routing = None if res.routing is None else np.zeros(
                (n, *res.routing.shape[1:]), res.routing.dtype)
            return TurnOutput(tokens=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32),
                              routing=routing, stop=StopReason.POOL_FULL)
        if res.n_in_new != len(req.new_tokens):
            raise RuntimeError(f"engine absorbed {res.n_in_new} of {len(req.new_tokens)} "
                               f"prompt tokens in slot {req.slot}: its max_context is "
                               "smaller than the organisation's window")
        routing = res.routing
        if pre is not None and routing is not None:
            routing = np.concatenate([pre, routing], axis=0)
        return TurnOutput(tokens=np.asarray(res.tokens, np.int32),
                          logprobs=np.asarray(res.logprobs, np.float32),
                          routing=routing, stop=res.stop_reason)

    def release(self, key: AgentKey) -> None:
        s = self._slots.pop(key, None)
        if s is not None:
            self.engine.release(s.slot)
