"""The engine behind the server: one thread owns it, every request's turns join its dispatches.

HTTP threads hand a `Job` (prompt ids, n choices, sampling, limits) to `EngineWorker.submit`
and read its events (`Job.events`): ("tokens", choice, ids, logprobs) as a choice's tokens come,
("done", choice, finish reason), then ("end",) once every choice is done, or ("error", text).
The worker thread submits each job's turns to the running engine (`Engine.submit`) and steps it
(`Engine.step`): turns of concurrent requests share prefill chunks and decode dispatches
(continuous batching), whatever thread they came from.

Slots and prefix reuse. A finished choice leaves its context in its slot: the prompt and the
ids it sampled, exactly what the KV holds. Those slots stay cached (least recently used first
out) keyed by their ids; a request whose prompt starts with a cached context takes that slot
and sends only the rest (a conversation that continues its previous request prefills only its
new messages: `chat.SampledIds` makes the ids of the previous answer the ones sampled). With
`n` > 1 the prompt is prefilled once and the slot forked (`Engine.fork`: full pages shared).

Streaming. A streamed choice runs as turns of `stream_chunk` tokens, each continuing the slot
(the engine's sampling is keyed by seed and position, so the tokens equal one long turn's);
stop strings are then found by the worker (`requests.find_stop_string`, as the engine finds
them), the rest sampled in that chunk left in the KV, and the slot is not cached (its
context is not the answer the client saw).
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading

import numpy as np

from avalon.inference.api import SamplingParams, StopReason, TurnRequest, TurnResult
from avalon.inference.engine import Engine
from avalon.inference.requests import find_stop_string

FINISH = {StopReason.STOP: "stop", StopReason.LENGTH: "length",
          StopReason.CONTEXT_FULL: "length", StopReason.POOL_FULL: "length"}


@dataclasses.dataclass
class Job:
    prompt: np.ndarray  # int32 [n_prompt]
    n: int
    max_tokens: int
    sampling: tuple[SamplingParams, ...]  # one per choice
    stop_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    stream: bool
    events: queue.Queue = dataclasses.field(default_factory=queue.Queue)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    cached_tokens: int = 0  # prompt tokens found in a cached slot (not prefilled)


@dataclasses.dataclass
class _Choice:
    job: Job
    index: int
    slot: int
    kv: list  # the slot's context ids (what its KV holds)
    tokens: list = dataclasses.field(default_factory=list)  # sampled ids returned
    done: bool = False


class EngineWorker:
    """Owns `engine`; see the module docstring. `close()` stops the thread."""

    def __init__(self, engine: Engine, *, stream_chunk: int | None = None):
        self.engine = engine
        self.stream_chunk = stream_chunk or 2 * engine.steps_per_dispatch
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._waiting: collections.deque[Job] = collections.deque()  # no free slot yet
        self._cache: collections.OrderedDict[int, tuple[int, ...]] = collections.OrderedDict()
        self._running: dict[int, _Choice] = {}  # slot -> choice with a turn in the engine
        self._prefilling: dict[int, tuple[Job, int]] = {}  # slot -> (job, reused) before fork
        self._open: dict[int, list[_Choice]] = {}  # id(job) -> its choices
        self._held: set[int] = set()  # slots allocated by this worker (running or cached)
        self.cache_hits = 0
        self.cached_tokens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="engine-worker")
        self._thread.start()

    # ---- from HTTP threads -----------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        self._inbox.put(job)
        return job

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    # ---- the worker thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self.engine.busy and not self._waiting
            try:
                self._waiting.append(self._inbox.get(timeout=0.05) if idle
                                     else self._inbox.get_nowait())
                while True:
                    self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            try:
                self._start_waiting()
                if self.engine.busy:
                    for res in self.engine.step():
                        self._on_result(res)
            except Exception as e:  # an engine bug: fail the requests in it, keep serving
                self._fail_all(f"{type(e).__name__}: {e}")

    def _fail_all(self, why: str) -> None:
        jobs = {id(c.job): c.job for c in self._running.values()}
        jobs.update({id(j): j for j, _ in self._prefilling.values()})
        for job in jobs.values():
            job.events.put(("error", why))
        self._running.clear()
        self._prefilling.clear()
        self._open.clear()
        self._cache.clear()
        while self.engine.busy:  # let the turns in flight end, then free every slot
            self.engine.step()
        for slot in sorted(self._held):
            self.engine.release(slot)
        self._held.clear()

    def _free_slots(self) -> int:
        return self.engine.num_slots - len(self._held) + len(self._cache)

    def _allocate(self) -> int:
        if len(self._held) >= self.engine.num_slots:
            self._release(self._cache.popitem(last=False)[0])
        slot = self.engine.allocate()
        self._held.add(slot)
        return slot

    def _release(self, slot: int) -> None:
        self._cache.pop(slot, None)
        self._held.discard(slot)
        self.engine.release(slot)

    def _start_waiting(self) -> None:
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled.is_set():
                self._waiting.popleft()
                job.events.put(("end",))
                continue
            if self._free_slots() < job.n:
                return
            self._waiting.popleft()
            self._start(job)

    def _take_slot(self, prompt: np.ndarray) -> tuple[int, int]:
        """(slot, prompt tokens already in it): the cached context that is the longest prefix
        of `prompt`, else a fresh slot (evicting the least recently used cached one)."""
        best, best_len = None, 0
        for slot, ctx in self._cache.items():
            n = len(ctx)
            if best_len < n <= len(prompt) and np.array_equal(prompt[:n], ctx):
                best, best_len = slot, n
        if best is not None:
            del self._cache[best]
            self.cache_hits += 1
            self.cached_tokens += best_len
            return best, best_len
        return self._allocate(), 0

    def _start(self, job: Job) -> None:
        slot, reused = self._take_slot(job.prompt)
        job.cached_tokens = reused
        if job.n == 1:
            c = _Choice(job, 0, slot, list(job.prompt[:reused]))
            self._open[id(job)] = [c]
            self._turn(c, job.prompt[reused:])
            return
        if reused < len(job.prompt):  # prefill once, then fork
            self._prefilling[slot] = (job, reused)
            self.engine.submit([TurnRequest(slot=slot, new_tokens=job.prompt[reused:],
                                            max_new_tokens=0, sampling=job.sampling[0])])
            return
        self._fork(job, slot)

    def _fork(self, job: Job, slot: int) -> None:
        while self.engine.num_slots - len(self._held) < job.n - 1:
            self._release(next(iter(self._cache)))
        forks = self.engine.fork(slot, job.n - 1)
        self._held.update(forks)
        slots = [slot] + forks
        choices = [_Choice(job, i, s, list(job.prompt)) for i, s in enumerate(slots)]
        self._open[id(job)] = choices
        for c in choices:
            self._turn(c, job.prompt[:0])

    def _turn(self, c: _Choice, new: np.ndarray) -> None:
        job = c.job
        left = job.max_tokens - len(c.tokens)
        self._running[c.slot] = c
        c.kv += [int(t) for t in new]
        self.engine.submit([TurnRequest(
            slot=c.slot, new_tokens=np.asarray(new, np.int32),
            max_new_tokens=min(left, self.stream_chunk) if job.stream else left,
            sampling=job.sampling[c.index], stop_tokens=job.stop_ids,
            stop_strings=() if job.stream else job.stop_strings)])

    def _on_result(self, res: TurnResult) -> None:
        if res.slot in self._prefilling:
            job, _ = self._prefilling.pop(res.slot)
            self._fork(job, res.slot)
            return
        c = self._running.pop(res.slot)
        job = c.job
        new = [int(t) for t in res.tokens]
        c.kv += new
        start = len(c.tokens)
        c.tokens += new
        logprobs = [float(x) for x in res.logprobs]
        reason = res.stop_reason
        cut = None
        if job.stream and job.stop_strings and new:
            j = find_stop_string(c.tokens, start, job.stop_strings, self.engine.detokenize)
            if j is not None:
                cut = j + 1
                reason = StopReason.STOP
        if cut is not None:
            keep = cut - start
            job.events.put(("tokens", c.index, new[:keep], logprobs[:keep]))
            c.tokens = c.tokens[:cut]
        elif new:
            job.events.put(("tokens", c.index, new, logprobs))
        more = job.stream and cut is None and reason is StopReason.LENGTH and \
            len(c.tokens) < job.max_tokens and not job.cancelled.is_set()
        if more:
            self._turn(c, np.zeros(0, np.int32))
            return
        c.done = True
        job.events.put(("done", c.index, FINISH[reason]))
        exact = cut is None and self.engine.context_length(c.slot) == len(c.kv)
        if exact:
            self._cache[c.slot] = tuple(c.kv)
        else:
            self._release(c.slot)
        choices = self._open.get(id(job), [])
        if all(x.done for x in choices):
            self._open.pop(id(job), None)
            job.events.put(("end",))

    def stats(self) -> dict:
        s = self.engine.stats
        return {"prefill_dispatches": s.prefill_dispatches,
                "decode_dispatches": s.decode_dispatches, "prefill_tokens": s.prefill_tokens,
                "decode_tokens": s.decode_tokens,
                "steps_per_dispatch": self.engine.steps_per_dispatch,
                "cache_hits": self.cache_hits, "cached_prompt_tokens": self.cached_tokens,
                "cached_slots": len(self._cache)}
