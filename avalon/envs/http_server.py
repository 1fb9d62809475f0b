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

Hostile or broken clients (`ServerLimits`; every refusal is a 4xx JSON reply, never a 500):
  * a thread per connection and a listen backlog of `backlog`, so bursts of clients queue
    instead of being dropped;
  * each request (line, headers and body) must arrive within `read_timeout_s` of its first
    read, and an idle kept-alive connection is closed after it: a client that sends headers and
    no body holds a thread for that long, not forever;
  * `Content-Length` is required on POST (411) and must be plain decimal digits (400: negative,
    signed, non-numeric, repeated with different values); a body over `max_body_bytes` is
    refused (413) before a byte of it is read; chunked bodies are refused (411). After a refusal
    whose body was not read the connection is closed (its bytes must not be parsed as a
    request);
  * a body that is not UTF-8 JSON, holds NaN/Infinity, or nests deeper than `max_json_depth`
    is a 400 (Python's own parser would otherwise raise RecursionError on deep input);
  * sessions not used for `session_ttl_s` are reaped (their directories removed), so abandoned
    sessions never fill the table; a full table of live sessions refuses new ones (400).

Each session has a lock (the org calls a session from one thread anyway) and, when the
environment `uses_workspace`, its own directory that mirrors the client's workspace: a request
carries the client's snapshot, and a reply to start or call carries the directory's snapshot
when the environment changed it (a layout written in `on_start`). Requests
for different sessions run concurrently; environment-level calls share one lock.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from avalon.envs import wire
from avalon.envs.base import Environment, Split, UnknownTaskError
from avalon.org.env import EnvSession, ToolError
from avalon.org.workspace import Workspace


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 64 << 20
    read_timeout_s: float = 10.0  # for a whole request, and for an idle kept-alive connection
    # A session unused this long is reaped. Long: a live rollout can go minutes between calls
    # to its session (long turns, waits), and reaping it would fail that rollout.
    session_ttl_s: float = 3600.0
    max_sessions: int = 4096
    backlog: int = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
    max_json_depth: int = 64

    def __post_init__(self):
        for name in ("max_body_bytes", "max_sessions", "backlog", "max_json_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerLimits.{name} must be an int >= 1, got {value!r}")
        for name in ("read_timeout_s", "session_ttl_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ServerLimits.{name} must be a number > 0, got {value!r}")



class _HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str, *, close: bool = False):
        super().__init__(message)
        self.status, self.kind, self.close = status, kind, close


@dataclasses.dataclass
class _Open:
    session: EnvSession
    lock: threading.Lock
    workspace: Workspace | None
    root: str | None
    last_used: float  # time.monotonic() of the last request's end
    closed: bool = False  # ended, closed or reaped: requests that still hold it get a 404


class EnvServer:
    """An HTTP server for one environment, run in a daemon thread (see the module docstring)."""

    def __init__(self, env: Environment, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits = ServerLimits()):
        self.env = env
        self.limits = limits
        self._sessions: dict[str, _Open] = {}
        self._lock = threading.Lock()  # the session table and environment-level calls
        self._conns: set[socket.socket] = set()  # open keep-alive connections
        self._next_reap = 0.0
        self.reaped = 0  # sessions expired so far
        self._httpd = _Server((host, port), _Handler, bind_and_activate=False)
        self._httpd.request_queue_size = limits.backlog  # read by listen() in server_activate
        try:
            self._httpd.server_bind()
            self._httpd.server_activate()
        except BaseException:
            self._httpd.server_close()
            raise
        self._httpd.daemon_threads = True
        self._httpd.app = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> EnvServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                            daemon=True, name=f"env-server-{self.env.name}")
            self._thread.start()
        return self

    def close(self) -> None:
        """Stops serving (kept-alive connections too) and drops every open session."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            for entry in self._sessions.values():
                entry.closed = True
                if entry.root is not None:
                    shutil.rmtree(entry.root, ignore_errors=True)
            self._sessions.clear()

    def __enter__(self) -> EnvServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # ----- routes -----

    def handle(self, method: str, path: str, query: dict, body: dict) -> dict:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and parts == ["env"]:
            return {"name": self.env.name, "uses_workspace": bool(self.env.uses_workspace),
                    "vocabulary": list(self.env.vocabulary())}
        if method == "GET" and parts == ["tasks"]:
            split = query.get("split", [""])[0]
            try:
                s = Split(split)
            except ValueError:
                raise _HttpError(400, "bad_request", f"split must be train or heldout, got "
                                 f"{split!r}") from None
            with self._lock:
                return {"task_ids": list(self.env.task_ids(s))}
        if method != "POST":
            raise _HttpError(404, "not_found", f"no route {method} {path}")
        if parts == ["task"]:
            with self._lock:
                task = self.env.task(wire.field(body, "task_id", str, "task request"),
                                     _clock(body))
            return {"task": wire.task_to_json(task)}
        if parts == ["sessions"]:
            return self._open(body)
        if len(parts) == 3 and parts[0] == "sessions":
            return self._session_call(parts[1], parts[2], body)
        raise _HttpError(404, "not_found", f"no route {method} {path}")

    def _open(self, body: dict) -> dict:
        task_id = wire.field(body, "task_id", str, "session request")
        seed = wire.field(body, "seed", int, "session request")
        clock = _clock(body)
        self._reap_idle()
        with self._lock:
            if len(self._sessions) >= self.limits.max_sessions:
                raise _HttpError(400, "bad_request", f"{self.limits.max_sessions} sessions are "
                                 f"open (the limit) and none has been idle for "
                                 f"{self.limits.session_ttl_s:g} s: end or close some")
            session = self.env.session(task_id, seed, clock)
            task = session.task
            sid = secrets.token_hex(8)
            root = ws = None
            if self.env.uses_workspace:
                root = tempfile.mkdtemp(prefix="avalon-envsrv-")
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
        unknown = _HttpError(404, "unknown_session", f"no open session {sid!r} (ended, closed, "
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
                self._sync(entry, body)
                ctx = wire.end_ctx_from_json(wire.field(body, "ctx", dict, "end request"),
                                             entry.workspace)
                final = entry.session.on_end(ctx)
            finally:
                self._drop(sid, entry)
            return {"final": wire.final_to_json(final)}
        if op == "close":
            self._drop(sid, entry)
            return {}
        raise _HttpError(404, "not_found", f"no session operation {op!r}")

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

    def _sync(self, entry: _Open, body: dict) -> dict | None:
        """Mirrors the client's workspace snapshot; returns it (None without a workspace)."""
        if entry.workspace is None:
            return None
        snap = wire.field(body, "workspace", dict, "request")
        wire.restore(entry.workspace, snap)
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


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client hung up or stalled: nothing to say, the connection is closed
        super().handle_error(request, client_address)


def _clock(body: dict) -> float | None:
    return wire.field(body, "clock_s", (int, float, type(None)), "request")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _json_depth_exceeds(value, limit: int) -> bool:
    """Whether `value` nests lists/objects deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))
    return False


_DIGITS = re.compile(r"[0-9]{1,19}")


class _DeadlineReader:
    """The connection's reader, each read bounded by the current request's deadline."""

    def __init__(self, raw, sock: socket.socket, handler: _Handler):
        self._raw, self._sock, self._handler = raw, sock, handler

    def _arm(self) -> None:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self._sock.settimeout(left)

    def readline(self, limit: int = -1) -> bytes:
        self._arm()
        return self._raw.readline(limit)

    def read1(self, n: int) -> bytes:
        self._arm()
        return self._raw.read1(n)

    def read(self, n: int = -1) -> bytes:
        self._arm()
        return self._raw.read(n)

    def close(self) -> None:
        self._raw.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client thread
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms stalls
    deadline = 0.0  # time.monotonic() by which the current request must have arrived

    def log_message(self, format, *args):  # quiet: errors go back to the client
        pass

    @property
    def app(self) -> EnvServer:
        return self.server.app  # type: ignore[attr-defined]

    def setup(self):
        self.timeout = self.app.limits.read_timeout_s  # also bounds writes to a stalled client
        super().setup()
        self.rfile = _DeadlineReader(self.rfile, self.connection, self)
        with self.app._lock:
            self.app._conns.add(self.connection)

    def finish(self):
        with self.app._lock:
            self.app._conns.discard(self.connection)
        super().finish()

    def handle_one_request(self):
        self.deadline = time.monotonic() + self.app.limits.read_timeout_s
        super().handle_one_request()

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def _serve(self, method: str) -> None:
        app = self.app
        url = urlsplit(self.path)
        close = False
        try:
            body = self._body(method)
            status, reply = 200, app.handle(method, url.path, parse_qs(url.query), body)
        except _HttpError as e:
            status, reply, close = e.status, {"error": str(e), "kind": e.kind}, e.close
        except UnknownTaskError as e:
            status, reply = 404, {"error": str(e), "kind": "unknown_task"}
        except (wire.WireError, ValueError, TypeError) as e:
            status, reply = 400, {"error": f"{type(e).__name__}: {e}", "kind": "bad_request"}
        except (TimeoutError, ConnectionError):
            raise  # the client stalled or left mid-body: drop the connection, no reply
        except Exception as e:  # a bug in the environment: report it, keep serving
            status, reply = 500, {"error": f"{type(e).__name__}: {e}", "kind": "env_error"}
        try:
            data = json.dumps(reply, allow_nan=False).encode("utf-8")
        except ValueError as e:  # e.g. a NaN reward: also an environment bug
            status = 500
            data = json.dumps({"error": f"reply is not JSON: {e}", "kind": "env_error"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _length(self, method: str) -> int:
        """The body's length from the headers, strictly (see the module docstring)."""
        limits = self.app.limits
        if self.headers.get("Transfer-Encoding") is not None:
            raise _HttpError(411, "bad_request", "Transfer-Encoding is not supported: send a "
                             "Content-Length", close=True)
        values = self.headers.get_all("Content-Length") or []
        if not values:
            if method == "POST":
                raise _HttpError(411, "bad_request", "POST needs a Content-Length", close=True)
            return 0
        if len(set(v.strip() for v in values)) != 1 or not _DIGITS.fullmatch(values[0].strip()):
            shown = ", ".join(repr(v) for v in values)[:80]
            raise _HttpError(400, "bad_request", f"Content-Length must be one non-negative "
                             f"decimal number, got {shown}", close=True)
        n = int(values[0])
        if n > limits.max_body_bytes:
            raise _HttpError(413, "bad_request", f"body of {n} bytes is over the limit of "
                             f"{limits.max_body_bytes}", close=True)
        if method == "GET" and n:
            raise _HttpError(400, "bad_request", "GET takes no body", close=True)
        return n

    def _body(self, method: str) -> dict:
        n = self._length(method)
        if method == "GET":
            return {}
        raw = bytearray()
        while len(raw) < n:  # the deadline reader bounds the wait for each piece
            chunk = self.rfile.read1(min(n - len(raw), 1 << 20))
            if not chunk:
                raise ConnectionError("client closed the connection mid-body")
            raw += chunk
        try:
            body = json.loads(bytes(raw) or b"{}", parse_constant=_refuse_constant)
        except RecursionError:
            raise _HttpError(400, "bad_request", "body nests too deeply") from None
        except ValueError as e:  # includes bytes that are not UTF-8
            raise _HttpError(400, "bad_request", f"body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise _HttpError(400, "bad_request", "body must be a JSON object")
        if _json_depth_exceeds(body, self.app.limits.max_json_depth):
            raise _HttpError(400, "bad_request", f"body nests deeper than "
                             f"{self.app.limits.max_json_depth} levels")
        return body
