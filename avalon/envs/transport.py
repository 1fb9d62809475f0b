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
  * a deadline per phase of a request, each enforced on every read: an idle kept-alive
    connection is closed after `read_timeout_s`; the request line and headers must arrive
    within `head_timeout_s` of their first byte, and the body within `read_timeout_s` of the
    headers' end. Writes to a stalled reader are bounded by `read_timeout_s`;
  * the request line and headers hold at most `max_head_bytes` (431);
  * `Content-Length` is required on POST (411) and must be plain decimal digits (400: negative,
    signed, non-numeric, repeated with different values); a body over `max_body_bytes` is
    refused (413) before a byte of it is read; chunked bodies are refused (411). After a refusal
    whose body was not read the connection is closed (its bytes must not be parsed as a
    request);
  * a body that is not UTF-8 JSON, nests deeper than `max_json_depth`, or holds a number that
    is not a finite double (NaN, Infinity, `1e400`: `avalon/org/json_input.py`'s rule, the one
    tool calls follow) is a 400.
Global caps, whatever the clients do (a refusal is a 503 `overloaded`, which clients retry):
  * `max_connections` open connections (each holds one thread);
  * `max_inflight_request_bytes`: the memory requests being read or handled hold, reserved
    before it is taken: each head line at `HEAD_PARSE_FACTOR` times its bytes (what parsing
    headers makes of them), each body by its Content-Length before a byte is read and then by
    `json_input.parsed_size_bound` before it is parsed (a body of empty objects takes ~25x its
    bytes parsed). A body whose bound alone is over the cap is a 413;
  * `max_worker_threads`: threads a service starts besides the connections' (the ORS server's
    running calls), through `start_worker`.
Slow clients cannot hold what honest ones need: when every connection is taken, or the request
memory is short, the connection that has waited longest for its client's bytes (idle, or
sending a request's head or body) is answered 503 and closed to make room for the newer one; a
connection whose request is being handled is never taken. Honest clients send a request in
milliseconds, so a slow one is always the older; only when no connection waits is the newcomer
refused (503, by the accepting thread, which starts no thread for it).
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
from avalon.org import json_input

# Bytes of memory a head line takes once `http.client.parse_headers` made a message of it
# (measured with tracemalloc: 8.0-8.5x for heads of 60 KiB to 6 MiB).
HEAD_PARSE_FACTOR = 10


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 64 << 20
    read_timeout_s: float = 10.0  # an idle kept-alive connection; a request's body
    head_timeout_s: float = 5.0  # a request's line and headers, from their first byte
    max_head_bytes: int = 16 << 10  # a request's line and headers
    # A session unused this long is reaped. Long: a live rollout can go minutes between calls
    # to its session (long turns, waits), and reaping it would fail that rollout. (ORS clients
    # ping every 10-30 s, and the ORS server keeps the SDK's 900 s.)
    session_ttl_s: float = 3600.0
    max_sessions: int = 4096
    backlog: int = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
    max_json_depth: int = 64
    max_connections: int = 512  # open at once, one thread each
    # Heads and bodies being read or handled, bodies by their parsed size (module docstring).
    max_inflight_request_bytes: int = 256 << 20
    max_worker_threads: int = 256  # threads a service starts for work (ORS calls)

    def __post_init__(self):
        for name in ("max_body_bytes", "max_head_bytes", "max_sessions", "backlog",
                     "max_json_depth", "max_connections", "max_inflight_request_bytes",
                     "max_worker_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerLimits.{name} must be an int >= 1, got {value!r}")
        for name in ("read_timeout_s", "head_timeout_s", "session_ttl_s"):
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
        self._conns: dict[socket.socket, _Handler] = {}  # open connections and their handlers
        self._evicted: set[socket.socket] = set()  # taken for a newer client, not yet closed
        self.connections = 0  # accepted and not yet closed (each has a thread)
        self.inflight_request_bytes = 0  # reserved by requests being read or handled
        self.workers = 0  # threads started by `start_worker` and still running
        self.refused = 0  # requests and connections answered 503 for a global cap
        self.evicted = 0  # connections closed for a newer client (module docstring)
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

    # ----- connections and request memory (called with `_lock` held unless said) -----

    def _oldest_waiting(self, before: float, holding: bool = False) -> _Handler | None:
        """The connection that has waited longest for its client, if it began waiting before
        `before` (with `holding`, only one that holds request memory)."""
        best = None
        for handler in self._conns.values():
            since = handler.waiting_since
            if since is None or since >= before or handler.connection in self._evicted:
                continue
            if holding and not handler.reserved:
                continue
            if best is None or since < best.waiting_since:
                best = handler
        return best

    def _evict(self, handler: _Handler) -> socket.socket:
        """Marks `handler`'s connection taken (its memory given back now); the caller then
        `_kick`s the returned socket, outside the lock."""
        self._evicted.add(handler.connection)
        self.inflight_request_bytes -= handler.reserved
        handler.reserved = 0
        self.evicted += 1
        return handler.connection

    def _kick(self, sock: socket.socket, why: str) -> None:
        """A 503 to a connection taken for a newer client, then its end (its handler thread
        sees the socket shut and leaves). Not blocking: the reply fits the empty send buffer
        of a connection that was waiting for its client."""
        body = json.dumps(self.error_body(503, "overloaded", why)).encode()
        try:
            sock.send(_OVERLOADED % (len(body), body), socket.MSG_DONTWAIT)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def reserve(self, handler: _Handler, n: int, what: str, *, close: bool) -> None:
        """Reserves `n` bytes of request memory for `handler`'s request (not holding the lock),
        taking them from connections that have waited longer when short; else a 503."""
        limits = self.limits
        victims = []
        with self._lock:
            if handler.connection in self._evicted:
                raise ConnectionError("the connection was taken for a newer client")
            while self.inflight_request_bytes + n > limits.max_inflight_request_bytes:
                victim = self._oldest_waiting(handler.waiting_since or time.monotonic(),
                                              holding=True)
                if victim is None:
                    break
                victims.append(self._evict(victim))
            fits = self.inflight_request_bytes + n <= limits.max_inflight_request_bytes
            if fits:
                self.inflight_request_bytes += n
                handler.reserved += n
            else:
                self.refused += 1
                held = self.inflight_request_bytes
        for sock in victims:
            self._kick(sock, "the server needed this connection's request memory for a newer "
                             "request while it waited for its bytes: retry")
        if not fits:
            raise HttpError(503, "overloaded", f"{held} bytes of request memory are in use; "
                            f"{what} needs {n} more, over the limit of "
                            f"{limits.max_inflight_request_bytes}: retry later", close=close)

    def release(self, handler: _Handler) -> None:
        """Gives back the request memory `handler`'s request holds."""
        with self._lock:
            self.inflight_request_bytes -= handler.reserved
            handler.reserved = 0

    def claim(self, handler: _Handler) -> bool:
        """The request's bytes are all in (or it is refused): its connection stops waiting and
        can no longer be taken. False when it was taken already (then nothing is written)."""
        with self._lock:
            if handler.connection in self._evicted:
                return False
            handler.waiting_since = None
            return True

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
            conns, self._conns = list(self._conns), {}
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
        """One thread per connection, up to `max_connections`; past it the connection that has
        waited longest for its client is taken for this one, or, none waiting, a 503 from
        here."""
        app = self.app  # type: ignore[attr-defined]
        victim = None
        with app._lock:
            full = app.connections - len(app._evicted) >= app.limits.max_connections
            if full:
                waiting = app._oldest_waiting(time.monotonic())
                if waiting is not None:
                    victim, full = app._evict(waiting), False
                else:
                    app.refused += 1
            if not full:
                app.connections += 1
        if victim is not None:
            app._kick(victim, f"{app.limits.max_connections} connections are open (the "
                              "limit) and this one waited longest for its request: retry")
        if not full:
            try:
                super().process_request(request, client_address)
            except BaseException:
                with app._lock:
                    app.connections -= 1
                raise
            return
        body = json.dumps(app.error_body(503, "overloaded", f"{app.limits.max_connections} "
                                         "connections are open (the limit) and none waits for "
                                         "its client: retry later")).encode()
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
                app._evicted.discard(request)


def _error(kind: str, message: str) -> dict:
    return {"error": message, "kind": kind, "detail": message}


def _json_depth_exceeds(value, limit: int) -> bool:
    """Whether `value` nests lists/objects deeper than `limit`: iterative, holding one iterator
    per level (no recursion, and no memory per element)."""
    if not isinstance(value, (dict, list)):
        return False
    stack = [iter(value.values() if isinstance(value, dict) else value)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, (dict, list)):
                if len(stack) >= limit:
                    return True
                stack.append(iter(v.values() if isinstance(v, dict) else v))
                break
        else:
            stack.pop()
    return False


_DIGITS = re.compile(r"[0-9]{1,19}")


class _PhaseReader:
    """The connection's reader: every read waits at most until the current phase's deadline
    (one `recv` per step, so a client trickling bytes cannot stretch it), and each head line is
    counted against `max_head_bytes` and the request memory as it arrives."""

    def __init__(self, raw, sock: socket.socket, handler: _Handler):
        self._raw, self._sock, self._handler = raw, sock, handler

    def _arm(self) -> None:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the request's {self._handler.phase} did not arrive in time")
        self._sock.settimeout(left)

    def _peek(self) -> bytes:
        """What is buffered, reading once from the socket when nothing is (b"" at its end)."""
        self._arm()
        return self._raw.peek(1)

    def readline(self, limit: int = -1) -> bytes:
        handler = self._handler
        if handler.phase == "idle":  # the next request's first byte ends the idle wait
            if not self._peek():
                return b""
            handler.phase = "head"
            handler.deadline = time.monotonic() + handler.app.limits.head_timeout_s
        out = bytearray()
        while limit < 0 or len(out) < limit:
            buffered = self._peek()
            if not buffered:
                break
            want = len(buffered) if limit < 0 else min(len(buffered), limit - len(out))
            end = buffered.find(b"\n", 0, want)
            out += self._raw.read(want if end < 0 else end + 1)  # from the buffer: no recv
            if end >= 0:
                break
            if handler.phase == "head" and len(out) > handler.app.limits.max_head_bytes:
                break  # counted below: refused without reading the rest of the line
        if handler.phase == "head":
            handler.head_line(len(out))
        return bytes(out)

    def readinto1(self, buffer) -> int:
        self._arm()
        return self._raw.readinto1(buffer)

    def close(self) -> None:
        self._raw.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client thread
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms stalls
    deadline = 0.0  # time.monotonic() by which the current phase's bytes must have arrived
    phase = "idle"  # idle (between requests), head, body, handling
    waiting_since: float | None = None  # since when it waits for its client (None: handling)
    reserved = 0  # bytes of `max_inflight_request_bytes` this request holds
    head_bytes = 0

    def log_message(self, format, *args):  # quiet: errors go back to the client
        pass

    @property
    def app(self) -> HttpService:
        return self.server.app  # type: ignore[attr-defined]

    def setup(self):
        self.timeout = self.app.limits.read_timeout_s  # also bounds writes to a stalled client
        super().setup()
        self.rfile = _PhaseReader(self.rfile, self.connection, self)
        self.waiting_since = time.monotonic()
        with self.app._lock:
            self.app._conns[self.connection] = self

    def finish(self):
        with self.app._lock:
            self.app._conns.pop(self.connection, None)
        self.app.release(self)
        super().finish()

    def handle_one_request(self):
        app = self.app
        app.release(self)  # the previous request's memory
        with app._lock:
            if self.connection in app._evicted:
                self.close_connection = True
                return
            self.waiting_since = time.monotonic()
        self.phase, self.head_bytes = "idle", 0
        self.deadline = time.monotonic() + app.limits.read_timeout_s
        try:
            super().handle_one_request()
        except HttpError as e:  # the head broke a limit (raised by the reader)
            self.close_connection = True
            if app.claim(self):
                self._write(e.status, app.error_body(e.status, e.kind, str(e), e), close=True)

    def head_line(self, n: int) -> None:
        """Counts a head line of `n` bytes (the reader calls it): within `max_head_bytes`, and
        reserved in the request memory at what parsing makes of it."""
        limits = self.app.limits
        self.head_bytes += n
        if self.head_bytes > limits.max_head_bytes:
            raise HttpError(431, "bad_request", f"the request line and headers are over "
                            f"{limits.max_head_bytes} bytes", close=True)
        self.app.reserve(self, HEAD_PARSE_FACTOR * n, "a head line", close=True)

    def send_error(self, code, message=None, explain=None):
        """The base class's refusals of a malformed head (414, 431, 400, 501): written only
        when the connection was not taken meanwhile."""
        if not self.app.claim(self):
            self.close_connection = True
            return
        super().send_error(code, message, explain)

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
            self.phase = "handling"
            if not app.claim(self):
                raise ConnectionError("the connection was taken for a newer client")
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
        if not app.claim(self):  # taken while its body arrived: the 503 went out already
            self.close_connection = True
            return
        if isinstance(reply, SseReply):
            self._stream(reply)
            return
        try:
            data = json.dumps(reply, allow_nan=False).encode("utf-8")
        except ValueError as e:  # e.g. a NaN reward: also an environment bug
            status = 500
            data = json.dumps(app.error_body(500, "env_error", f"reply is not JSON: {e}")).encode()
        self._write_bytes(status, data, close)

    def _write(self, status: int, reply: dict, *, close: bool) -> None:
        self._write_bytes(status, json.dumps(reply).encode("utf-8"), close)

    def _write_bytes(self, status: int, data: bytes, close: bool) -> None:
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
        if n > min(limits.max_body_bytes, limits.max_inflight_request_bytes):
            limit = min(limits.max_body_bytes, limits.max_inflight_request_bytes)
            raise HttpError(413, "bad_request", f"body of {n} bytes is over the limit of "
                             f"{limit}", close=True)
        if method == "GET" and n:
            raise HttpError(400, "bad_request", "GET takes no body", close=True)
        return n

    def _body(self, method: str) -> dict:
        """Reads and parses the body within the request memory: its bytes are reserved before
        one is read, what parsing makes of them before it runs (module docstring)."""
        n = self._length(method)
        if method == "GET":
            return {}
        app, limits = self.app, self.app.limits
        self.phase = "body"
        self.deadline = time.monotonic() + limits.read_timeout_s
        app.reserve(self, n, f"a body of {n} bytes", close=True)
        raw = bytearray(n)
        view, got = memoryview(raw), 0
        while got < n:  # the phase reader bounds the wait for each piece; read in place
            read = self.rfile.readinto1(view[got:])
            if not read:
                raise ConnectionError("client closed the connection mid-body")
            got += read
        view.release()
        bound = json_input.parsed_size_bound(raw)
        if bound > limits.max_inflight_request_bytes - n:
            raise HttpError(413, "bad_request", f"a body of {n} bytes would take up to {bound} "
                            f"bytes parsed; the limit for a request is "
                            f"{limits.max_inflight_request_bytes}")
        app.reserve(self, bound, f"parsing a body of {n} bytes", close=False)
        try:
            body = json_input.loads(raw or b"{}")
        except ValueError as e:  # includes bytes that are not UTF-8, and deep nesting
            raise HttpError(400, "bad_request", f"body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise HttpError(400, "bad_request", "body must be a JSON object")
        if _json_depth_exceeds(body, limits.max_json_depth):
            raise HttpError(400, "bad_request", f"body nests deeper than "
                             f"{limits.max_json_depth} levels")
        return body
