"""Serves any `Environment` over HTTP + JSON (stdlib only), for `HttpEnvironment` clients.

    with EnvServer(ParallelSubtasks()) as server:      # 127.0.0.1, an ephemeral port
        env = HttpEnvironment(server.url)              # avalon/envs/http_client.py

Routes (request and response bodies are JSON objects; `wire.py` has the value forms):
  GET  /env                        -> {name, uses_workspace, vocabulary}
  GET  /tasks?split=train|heldout  -> {task_ids}
  POST /task      {task_id, clock_s}        -> {task}
  POST /sessions  {task_id, seed, clock_s}  -> {session, task}
  POST /sessions/ID/start {budget[, workspace]}              -> {[workspace]}
  POST /sessions/ID/brief {agent, index, title, role}        -> {text}
  POST /sessions/ID/call  {tool, args, ctx[, workspace]}     -> {outcome | tool_error[,
                                                                 workspace]}
  POST /sessions/ID/end   {ctx[, workspace]}                 -> {final}   (closes the session)
  POST /sessions/ID/close {}                                 -> {}        (abandons it)
Errors: {"error": message, "kind": k} with status 400 (bad_request: a malformed body, a bad
value), 404 (unknown_task, unknown_session, not_found) or 500 (env_error: the environment
raised something other than ToolError, i.e. a bug). A ToolError is a result, not an error, and
so is a call whose workspace snapshot cannot be mirrored (over the limits, a bad path).

Hostile or broken clients: the transport's limits (`avalon/envs/transport.py`: deadlines,
strict lengths, JSON depth, backlog), and sessions not used for `session_ttl_s` are reaped
(their directories removed), so abandoned sessions never fill the table; a full table of live
sessions refuses new ones (400).

This is Avalon's own protocol: it carries everything the organisation simulator exchanges with
an environment (the hire budget, per-agent briefs, the calling agent and its derived clock,
labelled rewards, final rewards and the wealth ratio, workspace snapshots). The Open Reward
Standard (`ors_server.py`, `ors.py`) carries a subset of it and is the door to other trainers
and other environment servers.

Each session has a lock (the org calls a session from one thread anyway) and, when the
environment `uses_workspace`, its own directory that mirrors the client's workspace: a request
carries the client's snapshot, and a reply to start or call carries the directory's snapshot
when the environment changed it (a layout written in `on_start`). Requests
for different sessions run concurrently; environment-level calls share one lock.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import threading
import time

from avalon.envs import wire
from avalon.envs.base import Environment, Split
from avalon.envs.transport import DEFAULT_LIMITS, HttpError, HttpService, ServerLimits
from avalon.org.env import EnvSession, ToolError
from avalon.org.workspace import Workspace

__all__ = ["EnvServer", "ServerLimits"]


@dataclasses.dataclass
class _Open:
    session: EnvSession
    lock: threading.Lock
    workspace: Workspace | None
    root: str | None
    last_used: float  # time.monotonic() of the last request's end
    closed: bool = False  # ended, closed or reaped: requests that still hold it get a 404


class EnvServer(HttpService):
    """An HTTP server for one environment, run in a daemon thread (see the module docstring)."""

    def __init__(self, env: Environment, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits = DEFAULT_LIMITS):
        self.env = env
        self._sessions: dict[str, _Open] = {}
        self._next_reap = 0.0
        self.reaped = 0  # sessions expired so far
        super().__init__(env.name, host, port, limits)

    def _closed(self) -> None:
        with self._lock:
            for entry in self._sessions.values():
                entry.closed = True
                if entry.root is not None:
                    shutil.rmtree(entry.root, ignore_errors=True)
            self._sessions.clear()

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # ----- routes -----

    def handle(self, method: str, path: str, query: dict, body: dict, headers) -> dict:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and parts == ["env"]:
            return {"name": self.env.name, "uses_workspace": bool(self.env.uses_workspace),
                    "vocabulary": list(self.env.vocabulary())}
        if method == "GET" and parts == ["tasks"]:
            split = query.get("split", [""])[0]
            try:
                s = Split(split)
            except ValueError:
                raise HttpError(400, "bad_request", f"split must be train or heldout, got "
                                 f"{split!r}") from None
            with self._lock:
                return {"task_ids": list(self.env.task_ids(s))}
        if method != "POST":
            raise HttpError(404, "not_found", f"no route {method} {path}")
        if parts == ["task"]:
            with self._lock:
                task = self.env.task(wire.field(body, "task_id", str, "task request"),
                                     _clock(body))
            return {"task": wire.task_to_json(task)}
        if parts == ["sessions"]:
            return self._open(body)
        if len(parts) == 3 and parts[0] == "sessions":
            return self._session_call(parts[1], parts[2], body)
        raise HttpError(404, "not_found", f"no route {method} {path}")

    def _open(self, body: dict) -> dict:
        task_id = wire.field(body, "task_id", str, "session request")
        seed = wire.field(body, "seed", int, "session request")
        clock = _clock(body)
        self._reap_idle()
        with self._lock:
            if len(self._sessions) >= self.limits.max_sessions:
                raise HttpError(400, "bad_request", f"{self.limits.max_sessions} sessions are "
                                 f"open (the limit) and none has been idle for "
                                 f"{self.limits.session_ttl_s:g} s: end or close some")
            session = self.env.session(task_id, seed, clock)
            task = session.task
            sid = secrets.token_hex(8)
            root = ws = None
            if self.env.uses_workspace:
                root = self.session_dirs.new()
                ws = Workspace(root)
            self._sessions[sid] = _Open(session, threading.Lock(), ws, root, time.monotonic())
        return {"session": sid, "task": wire.task_to_json(task)}

    def _reap_idle(self) -> None:
        """Drops sessions unused for `session_ttl_s` (one scan per quarter TTL, or when full)."""
        now = time.monotonic()
        ttl = self.limits.session_ttl_s
        roots = []
        with self._lock:
            full = len(self._sessions) >= self.limits.max_sessions
            if not full and now < self._next_reap:
                return
            self._next_reap = now + ttl / 4
            for sid, entry in list(self._sessions.items()):
                if now - entry.last_used <= ttl or not entry.lock.acquire(blocking=False):
                    continue  # recent, or a request is using it right now
                try:
                    entry.closed = True
                    del self._sessions[sid]
                    self.reaped += 1
                    roots.append(entry.root)
                finally:
                    entry.lock.release()
        for root in roots:
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)

    def _session_call(self, sid: str, op: str, body: dict) -> dict:
        with self._lock:
            entry = self._sessions.get(sid)
        unknown = HttpError(404, "unknown_session", f"no open session {sid!r} (ended, closed, "
                             f"idle over {self.limits.session_ttl_s:g} s, or never opened)")
        if entry is None:
            raise unknown
        with entry.lock:
            if entry.closed:
                raise unknown
            try:
                return self._session_op(sid, entry, op, body)
            finally:
                entry.last_used = time.monotonic()

    def _session_op(self, sid: str, entry: _Open, op: str, body: dict) -> dict:
        if op == "start":
            before = self._sync(entry, body)
            budget = wire.field(body, "budget", int, "start request")
            entry.session.on_start(budget, entry.workspace)
            return self._changes(entry, before, {})
        if op == "brief":
            w = "brief request"
            text = entry.session.brief(wire.field(body, "agent", str, w),
                                       wire.field(body, "index", int, w),
                                       wire.field(body, "title", str, w),
                                       wire.field(body, "role", str, w))
            return {"text": text}
        if op == "call":
            return self._call(entry, body)
        if op == "end":
            try:  # the session is gone afterwards, whatever happens
                # The end grades what it can: files the mirror cannot take (a name or size the
                # workspace refuses) are left out, never the end refused.
                self._sync(entry, body, lenient=True)
                ctx = wire.end_ctx_from_json(wire.field(body, "ctx", dict, "end request"),
                                             entry.workspace)
                final = entry.session.on_end(ctx)
            finally:
                self._drop(sid, entry)
            return {"final": wire.final_to_json(final)}
        if op == "close":
            self._drop(sid, entry)
            return {}
        raise HttpError(404, "not_found", f"no session operation {op!r}")

    def _call(self, entry: _Open, body: dict) -> dict:
        tool = wire.field(body, "tool", str, "call request")
        args = wire.field(body, "args", dict, "call request")
        ctx_json = wire.field(body, "ctx", dict, "call request")
        try:  # what the agents left in the workspace is the agents' doing: a tool error
            before = self._sync(entry, body)
        except wire.WireError as e:
            return {"tool_error": str(e)}
        ctx = wire.call_ctx_from_json(ctx_json, entry.workspace)
        try:
            reply = {"outcome": wire.outcome_to_json(entry.session.call(tool, args, ctx))}
        except ToolError as e:
            reply = {"tool_error": str(e)}
        return self._changes(entry, before, reply)

    def _sync(self, entry: _Open, body: dict, lenient: bool = False) -> dict | None:
        """Mirrors the client's workspace snapshot; returns it (None without a workspace)."""
        if entry.workspace is None:
            return None
        snap = wire.field(body, "workspace", dict, "request")
        wire.restore(entry.workspace, snap, lenient=lenient)
        return snap

    def _changes(self, entry: _Open, before: dict | None, reply: dict) -> dict:
        """Adds the workspace to `reply` if the environment changed it."""
        if entry.workspace is not None and before is not None:
            after, _ = wire.snapshot(entry.workspace)
            if after["files"] != before["files"]:
                reply["workspace"] = after
        return reply

    def _drop(self, sid: str, entry: _Open) -> None:
        """Removes a session whose lock the caller holds."""
        entry.closed = True
        with self._lock:
            self._sessions.pop(sid, None)
        if entry.root is not None:
            shutil.rmtree(entry.root, ignore_errors=True)


def _clock(body: dict) -> float | None:
    return wire.field(body, "clock_s", (int, float, type(None)), "request")
