"""The hardened HTTP transport under Avalon's environment server, the Open Reward Standard's
(`ors_server.OrsServer`, with its Avalon extension: docs/ors_extension.md).

An `HttpService` subclass implements `handle(method, path, query, body, headers)` and returns a
JSON value (sent with a Content-Length on a kept-alive connection) or an `SseReply` (a
`text/event-stream` written event by event, then the connection is closed). Raise `HttpError`
for a refusal; an `UnknownTaskError` is a 404 `unknown_task`, a ValueError/TypeError a 400
`bad_request`, anything else a 500 `env_error` (a bug in the environment: reported, and the
server keeps serving). Error bodies are `{"error", "kind", "detail"}` (`detail` repeats the
message, as FastAPI servers put it).

Hostile or broken clients (`ServerLimits`; every refusal is a 4xx JSON reply, never a 500):
  * a thread per connection and a listen backlog of `backlog`, so bursts of clients queue
    instead of being dropped;
  * each request (line, headers and body) must arrive within `read_timeout_s` of its first
    read, and an idle kept-alive connection is closed after it: a client that sends headers and
    no body holds a thread for that long, not forever; writes to a stalled reader are bounded
    by the same timeout;
  * `Content-Length` is required on POST (411) and must be plain decimal digits (400: negative,
    signed, non-numeric, repeated with different values); a body over `max_body_bytes` is
    refused (413) before a byte of it is read; chunked bodies are refused (411). After a refusal
    whose body was not read the connection is closed (its bytes must not be parsed as a
    request);
  * a body that is not UTF-8 JSON, holds NaN/Infinity, or nests deeper than `max_json_depth`
    is a 400 (Python's own parser would otherwise raise RecursionError on deep input).
Global caps, whatever the clients do (a refusal is a 503 `overloaded`, which clients retry):
  * `max_connections` open connections (each holds one thread): one more is answered 503 and
    closed by the accepting thread, which starts no thread for it;
  * `max_inflight_body_bytes`: the bodies being read or handled at once, by their
    Content-Length, reserved before a byte is read (sixteen clients sending 55 MiB bodies held
    896 MiB before); a body that does not fit is refused unread and the connection closed;
  * `max_worker_threads`: threads a service starts besides the connections' (the ORS server's
    running calls), through `start_worker`.
Session lifetimes (`session_ttl_s`, `max_sessions`) are the services' own, read from the same
limits; sessions' directories live under `session_dirs` (`session_dirs.py`: a server killed
with SIGKILL leaves its directories to the next server to start, which removes them).
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Generator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from avalon.envs import wire
from avalon.envs.base import UnknownTaskError
from avalon.envs.session_dirs import SessionDirs


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 64 << 20
    read_timeout_s: float = 10.0  # for a whole request, and for an idle kept-alive connection
    # A session unused this long is reaped. Long: a live rollout can go minutes between calls
    # to its session (long turns, waits), and reaping it would fail that rollout. (ORS clients
    # ping every 10-30 s, and the ORS server keeps the SDK's 900 s.)
    session_ttl_s: float = 3600.0
    max_sessions: int = 4096
    backlog: int = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
    max_json_depth: int = 64
    max_connections: int = 512  # open at once, one thread each
    max_inflight_body_bytes: int = 256 << 20  # request bodies being read or handled at once
    max_worker_threads: int = 256  # threads a service starts for work (ORS calls)

    def __post_init__(self):
        for name in ("max_body_bytes", "max_sessions", "backlog", "max_json_depth",
                     "max_connections", "max_inflight_body_bytes", "max_worker_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerLimits.{name} must be an int >= 1, got {value!r}")
        for name in ("read_timeout_s", "session_ttl_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ServerLimits.{name} must be a number > 0, got {value!r}")


DEFAULT_LIMITS = ServerLimits()


class HttpError(Exception):
    """A refusal: the status, a short kind, the message (and whether to close the
    connection, when the request's body was not read)."""

    def __init__(self, status: int, kind: str, message: str, *, close: bool = False):
        super().__init__(message)
        self.status, self.kind, self.close = status, kind, close


@dataclasses.dataclass
class SseReply:
    """A server-sent-event stream: `events` yields (event, data) pairs, or None for a keepalive
    comment. Written as it is produced; the connection closes after the last event."""

    events: Generator[tuple[str, str] | None, None, None]


def sse_frame(event: str | None, data: str) -> bytes:
    """One SSE event (multi-line data as several `data:` lines); without an `event:` line
    when `event` is None (a plain message, as OpenAI-style streams send)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (lines if event is None else f"event: {event}\n{lines}").encode() + b"\n"


SSE_PING = b": ping\n\n"


class HttpService:
    """An HTTP server run in a daemon thread; subclasses implement `handle` (module docstring)."""

    def __init__(self, name: str, host: str, port: int, limits: ServerLimits):
        self.limits = limits
        self._name = name
        self._lock = threading.Lock()  # subclasses' tables, and the open connections
        self._conns: set[socket.socket] = set()  # open keep-alive connections
        self.connections = 0  # accepted and not yet closed (each has a thread)
        self.inflight_body_bytes = 0  # reserved by requests being read or handled
        self.workers = 0  # threads started by `start_worker` and still running
        self.refused = 0  # requests and connections answered 503 for a global cap
        self.session_dirs = SessionDirs()  # removes the roots of servers that died
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

    def handle(self, method: str, path: str, query: dict, body: dict,
               headers: Any) -> Any:
        raise NotImplementedError

    def error_body(self, status: int, kind: str, message: str,
                   error: Exception | None = None) -> dict:
        """The JSON body of a refusal (`{"error", "kind", "detail"}`); a service speaking
        another API's error objects overrides it."""
        return _error(kind, message)

    def start_worker(self, target, *args, name: str) -> None:
        """Runs `target(*args)` in a daemon thread, within `max_worker_threads` (else a 503)."""
        with self._lock:
            if self.workers >= self.limits.max_worker_threads:
                self.refused += 1
                raise HttpError(503, "overloaded", f"{self.workers} worker threads are busy "
                                f"(the limit): retry later")
            self.workers += 1

        def run():
            try:
                target(*args)
            finally:
                with self._lock:
                    self.workers -= 1

        try:
            threading.Thread(target=run, daemon=True, name=name).start()
        except BaseException:
            with self._lock:
                self.workers -= 1
            raise

    def _closed(self) -> None:
        """Called once the server has stopped: drop the sessions."""

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on (for raw-socket clients)."""
        host, port = self._httpd.server_address[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                            daemon=True, name=f"env-server-{self._name}")
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serves in the calling thread until interrupted (the command-line server)."""
        try:
            self._httpd.serve_forever(0.5)
        finally:
            self.close()

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
        self._closed()
        self.session_dirs.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


_OVERLOADED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client hung up or stalled: nothing to say, the connection is closed
        super().handle_error(request, client_address)

    def process_request(self, request, client_address):
        """One thread per connection, up to `max_connections`; past it a 503 from here."""
        app = self.app  # type: ignore[attr-defined]
        with app._lock:
            full = app.connections >= app.limits.max_connections
            if full:
                app.refused += 1
            else:
                app.connections += 1
        if not full:
            try:
                super().process_request(request, client_address)
            except BaseException:
                with app._lock:
                    app.connections -= 1
                raise
            return
        body = json.dumps(app.error_body(503, "overloaded", f"{app.limits.max_connections} "
                                         "connections are open (the limit): retry later"))
        body = body.encode()
        try:
            request.settimeout(1.0)  # a few hundred bytes into an empty send buffer
            request.sendall(_OVERLOADED % (len(body), body))
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            app = self.app  # type: ignore[attr-defined]
            with app._lock:
                app.connections -= 1


def _error(kind: str, message: str) -> dict:
    return {"error": message, "kind": kind, "detail": message}


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
    def app(self) -> HttpService:
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
        try:
            self._serve_reserved(method)
        finally:
            if self.reserved:
                with self.app._lock:
                    self.app.inflight_body_bytes -= self.reserved
                self.reserved = 0

    def _serve_reserved(self, method: str) -> None:
        app = self.app
        url = urlsplit(self.path)
        close = False
        try:
            body = self._body(method)
            status, reply = 200, app.handle(method, url.path, parse_qs(url.query), body,
                                            self.headers)
        except HttpError as e:
            status, reply, close = e.status, app.error_body(e.status, e.kind, str(e), e), e.close
        except UnknownTaskError as e:
            status, reply = 404, app.error_body(404, "unknown_task", str(e), e)
        except (wire.WireError, ValueError, TypeError) as e:
            status, reply = 400, app.error_body(400, "bad_request", f"{type(e).__name__}: {e}", e)
        except (TimeoutError, ConnectionError):
            raise  # the client stalled or left mid-body: drop the connection, no reply
        except Exception as e:  # a bug in the environment: report it, keep serving
            status, reply = 500, app.error_body(500, "env_error", f"{type(e).__name__}: {e}", e)
        if isinstance(reply, SseReply):
            self._stream(reply)
            return
        try:
            data = json.dumps(reply, allow_nan=False).encode("utf-8")
        except ValueError as e:  # e.g. a NaN reward: also an environment bug
            status = 500
            data = json.dumps(app.error_body(500, "env_error", f"reply is not JSON: {e}")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: SseReply) -> None:
        """Writes an event stream as it is produced, then closes the connection (its end is
        the stream's end: no length is known in advance)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for item in reply.events:
                self.wfile.write(SSE_PING if item is None else sse_frame(*item))
                self.wfile.flush()
        finally:
            reply.events.close()  # runs the generator's own cleanup now, not at collection

    def _length(self, method: str) -> int:
        """The body's length from the headers, strictly (see the module docstring)."""
        limits = self.app.limits
        if self.headers.get("Transfer-Encoding") is not None:
            raise HttpError(411, "bad_request", "Transfer-Encoding is not supported: send a "
                             "Content-Length", close=True)
        values = self.headers.get_all("Content-Length") or []
        if not values:
            if method == "POST":
                raise HttpError(411, "bad_request", "POST needs a Content-Length", close=True)
            return 0
        if len(set(v.strip() for v in values)) != 1 or not _DIGITS.fullmatch(values[0].strip()):
            shown = ", ".join(repr(v) for v in values)[:80]
            raise HttpError(400, "bad_request", f"Content-Length must be one non-negative "
                             f"decimal number, got {shown}", close=True)
        n = int(values[0])
        if n > limits.max_body_bytes:
            raise HttpError(413, "bad_request", f"body of {n} bytes is over the limit of "
                             f"{limits.max_body_bytes}", close=True)
        if method == "GET" and n:
            raise HttpError(400, "bad_request", "GET takes no body", close=True)
        return n

    reserved = 0  # bytes of `max_inflight_body_bytes` this request holds

    def _body(self, method: str) -> dict:
        n = self._length(method)
        if method == "GET":
            return {}
        app = self.app
        with app._lock:
            if app.inflight_body_bytes + n > app.limits.max_inflight_body_bytes:
                app.refused += 1
                raise HttpError(503, "overloaded", f"{app.inflight_body_bytes} bytes of "
                                f"request bodies are in flight; {n} more is over the limit of "
                                f"{app.limits.max_inflight_body_bytes}: retry later", close=True)
            app.inflight_body_bytes += n
            self.reserved = n
        raw = bytearray()
        while len(raw) < n:  # the deadline reader bounds the wait for each piece
            chunk = self.rfile.read1(min(n - len(raw), 1 << 20))
            if not chunk:
                raise ConnectionError("client closed the connection mid-body")
            raw += chunk
        try:
            body = json.loads(bytes(raw) or b"{}", parse_constant=_refuse_constant)
        except RecursionError:
            raise HttpError(400, "bad_request", "body nests too deeply") from None
        except ValueError as e:  # includes bytes that are not UTF-8
            raise HttpError(400, "bad_request", f"body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise HttpError(400, "bad_request", "body must be a JSON object")
        if _json_depth_exceeds(body, self.app.limits.max_json_depth):
            raise HttpError(400, "bad_request", f"body nests deeper than "
                             f"{self.app.limits.max_json_depth} levels")
        return body
