"""An `Environment` whose sessions live on an `EnvServer` (`avalon/envs/http_server.py`).

    env = HttpEnvironment("http://127.0.0.1:8123")
    session = env.session(env.task_ids(Split.TRAIN)[0], seed=0)   # an org EnvSession
    RolloutDriver(policy, chat, config).run([GroupSpec(0, (RolloutSpec(session, 3, 0),))])

Every `EnvSession` call becomes one request (stdlib `http.client`, JSON bodies, one keep-alive
connection per thread). The org protocol is
kept exactly: a server-side `ToolError` is raised here as `ToolError`; an unknown task id as
`UnknownTaskError`; a refused value (a bad clock, a malformed request) as `EnvRequestError` (a
ValueError); anything else (a dead server, a timeout, a reply that is not the expected JSON,
an environment bug on the server) as `EnvServerError`, naming the URL and what went wrong; a
503 (the server at one of its global caps, refused before it handled anything) is retried a
few times with backoff first.
With `uses_workspace`, start, each call and the end carry a snapshot of the rollout's
workspace, and a reply that carries one (the environment laid out or changed files) is written
back into it. What the agents leave in the workspace never raises past the organisation: a call
whose workspace does not fit a snapshot (over a cap, a symlink, a FIFO, a bad name) or that the
server refuses to mirror is a `ToolError`; the end sends the files that fit (the rest is
skipped), so the episode is always graded.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from typing import Any

from avalon.envs import wire
from avalon.envs.base import Split, UnknownTaskError, check_clock
from avalon.org.env import CallContext, EndContext, FinalOutcome, Task, ToolError, ToolOutcome
from avalon.org.workspace import Workspace

# A 503 (the server at a global cap: connections, bodies in flight) is retried after these waits
# (jittered), then reported.
OVERLOAD_RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0)


class EnvServerError(RuntimeError):
    """The environment server could not answer properly (see the message)."""


class EnvRequestError(ValueError):
    """The server refused a value of the request (the message names it)."""


class _Client:
    """JSON requests over one keep-alive connection per thread (reopened when it drops)."""

    def __init__(self, url: str, timeout_s: float):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"HttpEnvironment url must start with http:// or https://, "
                             f"got {url!r}")
        if not timeout_s > 0:
            raise ValueError(f"HttpEnvironment timeout_s must be > 0, got {timeout_s!r}")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._base = parts.path
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)  # per-thread cache, not a config default
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = kind(self._host, self._port, timeout=self.timeout_s)
        return conn

    def _send(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        for attempt in (0, 1):  # a kept-alive connection the server closed: reopen once
            conn = self._connection()
            try:
                conn.request(method, self._base + path, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        where = f"{method} {self.url}{path}"
        data = None if body is None else json.dumps(body, allow_nan=False).encode("utf-8")
        for delay in (*OVERLOAD_RETRY_S, None):
            try:
                status, raw = self._send(method, path, data)
            except (http.client.HTTPException, OSError) as e:
                raise EnvServerError(f"{where}: environment server unreachable ({e})") from None
            if status != 503 or delay is None:
                break
            # The server refused before handling anything (a global cap): safe to send again.
            time.sleep(delay * (0.5 + random.random()))
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            shown = raw[:80].decode("utf-8", errors="replace")
            raise EnvServerError(f"{where}: reply is not JSON (status {status}): {shown!r}") \
                from None
        if not isinstance(reply, dict):
            raise EnvServerError(f"{where}: reply is not a JSON object (status {status})")
        if status == 200:
            return reply
        message = reply.get("error", "(no message)")
        kind = reply.get("kind", "")
        if kind == "unknown_task":
            raise UnknownTaskError(message)
        if kind == "bad_request":
            raise EnvRequestError(f"{where}: {message}")
        raise EnvServerError(f"{where}: status {status} {kind}: {message}")


def _decode(decoder, value: Any, where: str):
    try:
        return decoder(value)
    except wire.WireError as e:
        raise EnvServerError(f"{where}: bad reply: {e}") from None


def _check_clock(clock_s, task_id) -> None:
    """A clock JSON cannot carry (NaN, infinity) is refused here, as the server would."""
    if clock_s is not None:
        check_clock(clock_s, 1.0, f"task {task_id!r}")


class HttpEnvironment:
    """The client side of `EnvServer` (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float = 120.0):
        self._client = _Client(url, timeout_s)
        info = self._client.request("GET", "/env")
        where = f"{self._client.url}/env"
        self._name = _decode(lambda v: wire.field(v, "name", str, "env"), info, where)
        self._uses_workspace = _decode(lambda v: wire.field(v, "uses_workspace", bool, "env"),
                                       info, where)
        vocab = _decode(lambda v: wire.field(v, "vocabulary", list, "env"), info, where)
        self._vocabulary = tuple(str(w) for w in vocab)

    @property
    def name(self) -> str:
        return self._name

    @property
    def uses_workspace(self) -> bool:
        return self._uses_workspace

    @property
    def url(self) -> str:
        return self._client.url

    def task_ids(self, split: Split) -> tuple[str, ...]:
        reply = self._client.request("GET", f"/tasks?split={Split(split).value}")
        ids = _decode(lambda v: wire.field(v, "task_ids", list, "tasks"), reply, self.url)
        return tuple(str(i) for i in ids)

    def task(self, task_id: str, clock_s: float | None = None) -> Task:
        _check_clock(clock_s, task_id)
        reply = self._client.request("POST", "/task", {"task_id": task_id, "clock_s": clock_s})
        return _decode(lambda v: wire.task_from_json(wire.field(v, "task", dict, "reply")),
                       reply, f"{self.url}/task")

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> HttpSession:
        _check_clock(clock_s, task_id)
        reply = self._client.request("POST", "/sessions",
                                     {"task_id": task_id, "seed": seed, "clock_s": clock_s})
        where = f"{self.url}/sessions"
        sid = _decode(lambda v: wire.field(v, "session", str, "reply"), reply, where)
        task = _decode(lambda v: wire.task_from_json(wire.field(v, "task", dict, "reply")),
                       reply, where)
        return HttpSession(self._client, sid, task, self._uses_workspace)

    def vocabulary(self) -> tuple[str, ...]:
        return self._vocabulary


class HttpSession:
    """An org `EnvSession` forwarding every call to the server."""

    def __init__(self, client: _Client, session_id: str, task: Task, uses_workspace: bool):
        self._client, self.session_id, self._task = client, session_id, task
        self._uses_workspace = uses_workspace
        self._path = f"/sessions/{session_id}"

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        body: dict = {"budget": budget}
        if self._uses_workspace:
            body["workspace"], _ = wire.snapshot(workspace)  # fresh: the environment's alone
        reply = self._client.request("POST", self._path + "/start", body)
        try:
            self._apply(reply, workspace)
        except wire.WireError as e:
            raise EnvServerError(f"{self._client.url}{self._path}: bad reply: {e}") from None

    def _apply(self, reply: dict, workspace: Workspace) -> None:
        if self._uses_workspace and "workspace" in reply:
            wire.restore(workspace, reply["workspace"])

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        reply = self._client.request("POST", self._path + "/brief", {
            "agent": agent, "index": index, "title": title, "role": role})
        return _decode(lambda v: wire.field(v, "text", str, "brief reply"), reply,
                       self._client.url + self._path)

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        body = {"tool": tool, "args": args, "ctx": wire.call_ctx_to_json(ctx)}
        if self._uses_workspace:
            snap, left_out = wire.snapshot(ctx.workspace)
            if left_out:
                raise ToolError(f"the workspace cannot be sent to the environment: "
                                f"{left_out[0]}" + (f" (and {len(left_out) - 1} more)"
                                                    if len(left_out) > 1 else ""))
            body["workspace"] = snap
        reply = self._client.request("POST", self._path + "/call", body)
        try:  # the server's files could not be written back: the agents' files are in the way
            self._apply(reply, ctx.workspace)
        except wire.WireError as e:
            raise ToolError(f"the environment's files could not be written back: {e}") from None
        if "tool_error" in reply:
            message = reply["tool_error"]
            raise ToolError(message if isinstance(message, str) else repr(message))
        return _decode(lambda v: wire.outcome_from_json(wire.field(v, "outcome", dict, "reply")),
                       reply, self._client.url + self._path)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        body: dict = {"ctx": wire.end_ctx_to_json(ctx)}
        if self._uses_workspace:
            body["workspace"], _ = wire.snapshot(ctx.workspace)  # what fits is graded
        reply = self._client.request("POST", self._path + "/end", body)
        return _decode(lambda v: wire.final_from_json(wire.field(v, "final", dict, "reply")),
                       reply, self._client.url + self._path)

    def close(self) -> None:
        """Abandons the session on the server (a rollout that will never end)."""
        self._client.request("POST", self._path + "/close", {})
