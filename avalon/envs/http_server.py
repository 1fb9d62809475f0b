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
raised something other than ToolError, i.e. a bug). A ToolError is a result, not an error.

Each session has a lock (the org calls a session from one thread anyway) and, when the
environment `uses_workspace`, its own directory that mirrors the client's workspace: a request
carries the client's snapshot, and a reply to start or call carries the directory's snapshot
when the environment changed it (a layout written in `on_start`). Requests
for different sessions run concurrently; environment-level calls share one lock.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import socket
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from avalon.envs import wire
from avalon.envs.base import Environment, Split, UnknownTaskError
from avalon.org.env import EnvSession, ToolError
from avalon.org.workspace import Workspace

MAX_BODY_BYTES = 64 << 20


class _HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclasses.dataclass
class _Open:
    session: EnvSession
    lock: threading.Lock
    workspace: Workspace | None
    root: str | None


class EnvServer:
    """An HTTP server for one environment, run in a daemon thread (see the module docstring)."""

    def __init__(self, env: Environment, host: str = "127.0.0.1", port: int = 0,
                 max_sessions: int = 4096):
        self.env = env
        self.max_sessions = max_sessions
        self._sessions: dict[str, _Open] = {}
        self._lock = threading.Lock()  # the session table and environment-level calls
        self._conns: set[socket.socket] = set()  # open keep-alive connections
        self._httpd = _Server((host, port), _Handler)
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
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise _HttpError(400, "bad_request", f"{self.max_sessions} sessions are open "
                                 "(the limit): end or close some")
            session = self.env.session(task_id, seed, _clock(body))
            task = session.task
            sid = secrets.token_hex(8)
            root = ws = None
            if self.env.uses_workspace:
                root = tempfile.mkdtemp(prefix="avalon-envsrv-")
                ws = Workspace(root)
            self._sessions[sid] = _Open(session, threading.Lock(), ws, root)
        return {"session": sid, "task": wire.task_to_json(task)}

    def _session_call(self, sid: str, op: str, body: dict) -> dict:
        with self._lock:
            entry = self._sessions.get(sid)
        if entry is None:
            raise _HttpError(404, "unknown_session", f"no open session {sid!r} (ended, closed "
                             "or never opened)")
        with entry.lock:
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
                self._sync(entry, body)
                ctx = wire.end_ctx_from_json(wire.field(body, "ctx", dict, "end request"),
                                             entry.workspace)
                final = entry.session.on_end(ctx)
                self._drop(sid)
                return {"final": wire.final_to_json(final)}
            if op == "close":
                self._drop(sid)
                return {}
        raise _HttpError(404, "not_found", f"no session operation {op!r}")

    def _call(self, entry: _Open, body: dict) -> dict:
        tool = wire.field(body, "tool", str, "call request")
        args = wire.field(body, "args", dict, "call request")
        before = self._sync(entry, body)
        ctx = wire.call_ctx_from_json(wire.field(body, "ctx", dict, "call request"),
                                      entry.workspace)
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
            after = wire.snapshot(entry.workspace)
            if after["files"] != before["files"]:
                reply["workspace"] = after
        return reply

    def _drop(self, sid: str) -> None:
        with self._lock:
            entry = self._sessions.pop(sid, None)
        if entry is not None and entry.root is not None:
            shutil.rmtree(entry.root, ignore_errors=True)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):  # a client hung up: nothing to say
            return
        super().handle_error(request, client_address)


def _clock(body: dict) -> float | None:
    return wire.field(body, "clock_s", (int, float, type(None)), "request")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not allowed")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client thread
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms stalls

    def log_message(self, format, *args):  # quiet: errors go back to the client
        pass

    def setup(self):
        super().setup()
        app: EnvServer = self.server.app  # type: ignore[attr-defined]
        with app._lock:
            app._conns.add(self.connection)

    def finish(self):
        app: EnvServer = self.server.app  # type: ignore[attr-defined]
        with app._lock:
            app._conns.discard(self.connection)
        super().finish()

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def _serve(self, method: str) -> None:
        app: EnvServer = self.server.app  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        try:
            body = self._body() if method == "POST" else {}
            status, reply = 200, app.handle(method, url.path, parse_qs(url.query), body)
        except _HttpError as e:
            status, reply = e.status, {"error": str(e), "kind": e.kind}
        except UnknownTaskError as e:
            status, reply = 404, {"error": str(e), "kind": "unknown_task"}
        except (wire.WireError, ValueError, TypeError) as e:
            status, reply = 400, {"error": f"{type(e).__name__}: {e}", "kind": "bad_request"}
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
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY_BYTES:
            raise _HttpError(400, "bad_request", f"body of {n} bytes is over {MAX_BODY_BYTES}")
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw or b"{}", parse_constant=_refuse_constant)
        except ValueError as e:
            raise _HttpError(400, "bad_request", f"body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise _HttpError(400, "bad_request", "body must be a JSON object")
        return body
