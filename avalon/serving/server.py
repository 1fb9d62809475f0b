"""An OpenAI-compatible HTTP server over the slot engine (`python -m avalon.serve`).

Routes: `GET /v1/models` (and `/v1/models/NAME`), `POST /v1/chat/completions` (see
`protocol.py` for the fields), `GET /health`, and `GET /avalon/stats` (the engine's dispatch
and token counters, and the prefix cache's hits: how a benchmark sees that concurrent requests
shared dispatches). It runs on the hardened transport (`avalon/envs/transport.py`): a thread
per connection, bounded request reads, body and connection caps, every refusal a 4xx or 503
JSON reply, here in the OpenAI API's error shape (`{"error": {message, type, param, code}}`).
Loopback unless told otherwise.

A request's messages become prompt ids (`chat.py`), its choices become engine turns run by the
worker thread (`scheduler.py`) beside every other request's. A completion's content is the
text of its sampled ids without the stop token (and cut before a stop string); the stop token
is in `logprobs` and `token_ids` (the policy sampled it). Temperature 0 is greedy; the
log-probs are the engine's (`avalon/inference/sampling.py`: the sampled token under the
temperature-scaled, untruncated distribution).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid

import numpy as np

from avalon.envs.transport import HttpService, ServerLimits, SseReply
from avalon.inference.api import SamplingParams
from avalon.inference.engine import Engine
from avalon.serving.chat import ChatRenderer, ToolCall
from avalon.serving.protocol import SEED_LIMIT, ApiError, ChatRequest, parse_chat
from avalon.serving.scheduler import EngineWorker, Job
from avalon.tokenizer.chat import ChatFormat

SERVE_LIMITS = ServerLimits(max_body_bytes=8 << 20, read_timeout_s=30.0, max_connections=256,
                            max_inflight_request_bytes=128 << 20)
PING_S = 10.0  # a keepalive comment on a stream that has had nothing to say this long


class OpenAIServer(HttpService):
    """`OpenAIServer(engine, chat, name=...).start()`; `url` + "/v1" is the client's base."""

    def __init__(self, engine: Engine, chat: ChatFormat, *, name: str, host: str = "127.0.0.1",
                 port: int = 0, limits: ServerLimits = SERVE_LIMITS,
                 stream_chunk: int | None = None, open_cut_answers: bool = False):
        if engine.detokenize is None:
            raise ValueError("OpenAIServer: the engine needs detokenize= (stop strings)")
        if chat.tok.vocab_size > engine.cfg.vocab_size:
            raise ValueError(f"OpenAIServer: the tokenizer has {chat.tok.vocab_size} ids, more "
                             f"than the model's vocab_size {engine.cfg.vocab_size}")
        super().__init__("openai", host, port, limits)
        self.name = name
        self.created = int(time.time())
        self.max_context = engine.max_context
        self.renderer = ChatRenderer(chat, open_cut_answers=open_cut_answers)
        self.tok = chat.tok
        self._lock = threading.Lock()  # the tokenizer's encode flips a flag (encode_markup)
        self.worker = EngineWorker(engine, stream_chunk=stream_chunk)

    def _closed(self) -> None:
        self.worker.close()

    def error_body(self, status: int, kind: str, message: str, error=None) -> dict:
        if isinstance(error, ApiError):
            return error.body()
        return {"error": {"message": message,
                          "type": "invalid_request_error" if status < 500 else "server_error",
                          "param": None, "code": kind}}

    # ---- routes ----------------------------------------------------------------------------
    def handle(self, method, path, query, body, headers):
        path = path.rstrip("/")
        routes = {("GET", "/v1/models"): self._models, ("GET", "/health"): dict,
                  ("GET", "/avalon/stats"): self.worker.stats}
        if (method, path) in routes:
            return routes[method, path]()
        if method == "GET" and path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != self.name:
                raise ApiError(404, f"model {name!r} does not exist (this server serves "
                               f"{self.name!r})", param="model", code="model_not_found")
            return self._model()
        if (method, path) == ("POST", "/v1/chat/completions"):
            return self._chat(body)
        known = {p for _, p in routes} | {"/v1/chat/completions"}
        if path in known:
            raise ApiError(405, f"{method} {path}: method not allowed", code="method_not_allowed")
        raise ApiError(404, f"{method} {path}: no such route (serving /v1/models and "
                       "/v1/chat/completions)", code="not_found")

    def _model(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "avalon", "max_model_len": self.max_context}

    def _models(self) -> dict:
        return {"object": "list", "data": [self._model()]}

    # ---- chat completions ------------------------------------------------------------------
    def _chat(self, body: dict):
        req = parse_chat(body, self.name)
        with self._lock:
            prompt = self.renderer.render(req.messages, req.tools)
        room = self.max_context - len(prompt)
        if room < 1:
            raise ApiError(400, f"messages: the prompt is {len(prompt)} tokens; this model's "
                           f"context is {self.max_context}", param="messages",
                           code="context_length_exceeded")
        if req.max_tokens is not None and req.max_tokens > room:
            raise ApiError(400, f"max_tokens={req.max_tokens}: the prompt is {len(prompt)} "
                           f"tokens and the context {self.max_context}, leaving {room}",
                           param="max_tokens", code="context_length_exceeded")
        greedy = req.temperature == 0
        sampling = tuple(SamplingParams(temperature=1.0 if greedy else req.temperature,
                                        top_p=req.top_p, greedy=greedy,
                                        seed=(req.seed + i) % SEED_LIMIT)
                         for i in range(req.n))
        job = self.worker.submit(Job(
            prompt=np.asarray(prompt, np.int32), n=req.n, max_tokens=req.max_tokens or room,
            sampling=sampling, stop_ids=self.renderer.stop_ids, stop_strings=req.stop,
            stream=req.stream))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.name}
        if req.stream:
            return SseReply(self._stream(req, job, prompt, head))
        return self._collect(req, job, prompt, head)

    def _body_ids(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in self.renderer.stop_ids else ids

    def _finish(self, req: ChatRequest, prompt, ids: list[int]):
        """(content, calls) of a finished choice; remembers its ids for the conversation."""
        body = self._body_ids(ids)
        with self._lock:
            return self.renderer.completion(prompt, body, tools=bool(req.tools),
                                            stop_strings=req.stop, ended=len(body) < len(ids))

    def _logprobs(self, ids, lps) -> dict:
        """Each sampled token: its text, log-prob and bytes (a token's own bytes, which may
        be part of a character: a client can map them back to the vocabulary's ids)."""
        raw = getattr(self.tok, "token_bytes", None)
        out = []
        for t, lp in zip(ids, lps):
            text = self.tok.decode([t])
            data = raw(t) if raw is not None else text.encode("utf-8")
            out.append({"token": text, "logprob": lp, "bytes": list(data), "top_logprobs": []})
        return {"content": out}

    @staticmethod
    def _calls(calls: tuple[ToolCall, ...]) -> list[dict]:
        return [{"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in calls]

    def _usage(self, prompt, ids, job: Job) -> dict:
        done = sum(map(len, ids))
        return {"prompt_tokens": len(prompt), "completion_tokens": done,
                "total_tokens": len(prompt) + done,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

    def _collect(self, req: ChatRequest, job: Job, prompt, head: dict) -> dict:
        ids = [[] for _ in range(req.n)]
        lps = [[] for _ in range(req.n)]
        finish = [None] * req.n
        while True:
            ev = job.events.get()
            if ev[0] == "tokens":
                ids[ev[1]] += ev[2]
                lps[ev[1]] += ev[3]
            elif ev[0] == "done":
                finish[ev[1]] = ev[2]
            elif ev[0] == "error":
                raise ApiError(500, f"the engine failed: {ev[1]}", kind="server_error")
            else:
                break
        choices = []
        for i in range(req.n):
            content, calls = self._finish(req, prompt, ids[i])
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = self._calls(calls)
            choice = {"index": i, "message": message,
                      "logprobs": self._logprobs(ids[i], lps[i]) if req.logprobs else None,
                      "finish_reason": "tool_calls" if calls else finish[i]}
            if req.return_token_ids:
                choice["token_ids"] = ids[i]
            choices.append(choice)
        out = {**head, "object": "chat.completion", "choices": choices,
               "usage": self._usage(prompt, ids, job), "system_fingerprint": None}
        if req.return_token_ids:
            out["prompt_token_ids"] = [int(t) for t in prompt]
        return out

    def _stream(self, req: ChatRequest, job: Job, prompt, head: dict):
        """SSE chunks: a role delta per choice, content deltas as tokens come (text held back
        while it may still end in a stop string or a cut UTF-8 character; with tools, the
        content and calls once the choice ends), a finish chunk per choice, usage if asked,
        then `[DONE]`."""
        head = {**head, "object": "chat.completion.chunk"}

        def chunk(i, delta, finish=None, logprobs=None):
            return None, json.dumps({**head, "choices": [{
                "index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

        n = req.n
        ids, lps, sent, lp_sent = [[] for _ in range(n)], [[] for _ in range(n)], [""] * n, [0] * n
        hold = max(map(len, req.stop), default=1) - 1
        try:
            for i in range(n):
                yield chunk(i, {"role": "assistant", "content": ""})
            while True:
                try:
                    ev = job.events.get(timeout=PING_S)
                except queue.Empty:
                    yield None
                    continue
                if ev[0] == "tokens":
                    i = ev[1]
                    ids[i] += ev[2]
                    lps[i] += ev[3]
                    if req.tools:
                        continue
                    text = self.tok.decode(self._body_ids(ids[i])).rstrip("\ufffd")
                    safe = text[:len(text) - hold] if hold else text
                    if len(safe) > len(sent[i]) and safe.startswith(sent[i]):
                        logprobs = self._logprobs(ids[i][lp_sent[i]:], lps[i][lp_sent[i]:]) \
                            if req.logprobs else None
                        yield chunk(i, {"content": safe[len(sent[i]):]}, logprobs=logprobs)
                        sent[i], lp_sent[i] = safe, len(ids[i])
                elif ev[0] == "done":
                    i = ev[1]
                    content, calls = self._finish(req, prompt, ids[i])
                    content = content or ""
                    rest = content[len(sent[i]):] if content.startswith(sent[i]) else content
                    logprobs = self._logprobs(ids[i][lp_sent[i]:], lps[i][lp_sent[i]:]) \
                        if req.logprobs and len(ids[i]) > lp_sent[i] else None
                    if rest or logprobs:
                        yield chunk(i, {"content": rest}, logprobs=logprobs)
                    if calls:
                        yield chunk(i, {"tool_calls": [
                            {"index": k, **c} for k, c in enumerate(self._calls(calls))]})
                    yield chunk(i, {}, finish="tool_calls" if calls else ev[2])
                elif ev[0] == "error":
                    yield None, json.dumps({"error": {"message": f"the engine failed: {ev[1]}",
                                                      "type": "server_error", "param": None,
                                                      "code": None}})
                    return
                else:
                    break
            if req.include_usage:
                yield None, json.dumps({**head, "choices": [],
                                        "usage": self._usage(prompt, ids, job)})
            yield None, "[DONE]"
        finally:
            job.cancelled.set()  # a client that left stops its choices at the next chunk
