"""Red-team attacks: the ORS server's memory, connection slots, session deletion and number
rule, against clients that are slow, hostile or merely odd. Every server listens on 127.0.0.1;
every wait has a timeout.

BLOCKED: the server kept its stated caps (the request memory it holds, measured with
tracemalloc, within `max_inflight_request_bytes`), kept serving honest clients in time,
removed a deleted session's directory and ran none of its calls after the delete, and answered
every refusal with a 4xx. CRASH: a cap did not hold, honest clients were refused, a deleted
session left its directory or ran a call, or a request got a 500.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import socket
import threading
import time
import tracemalloc
import uuid

from avalon.envs.base import Split
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.transport import ServerLimits
from avalon.org.env import FinalOutcome, Task, ToolOutcome, ToolSpec
from avalon.rl.types import Objective
from experiments.security.outcome import Attack, Outcome

B, C = Outcome.BLOCKED, Outcome.CRASH
_PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))
# What a server holds besides requests (its threads' frames, replies, tables) while the
# attacks measure it: the allowance over the stated cap.
SLACK_BYTES = 2 << 20


def _limits(memory: int, **kw) -> ServerLimits:
    """Limits with a request-memory cap of `memory` (the code before the cap counted bodies
    only, under another name)."""
    fields = {f.name for f in dataclasses.fields(ServerLimits)}
    name = "max_inflight_request_bytes" if "max_inflight_request_bytes" in fields \
        else "max_inflight_body_bytes"
    return ServerLimits(**{name: memory, "session_ttl_s": 900.0, **kw})


def _send(addr, raw: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """Sends `raw` (a whole request, `Connection: close`) and reads the reply: (status,
    reply); status 0 when the connection dropped without one."""
    reply = b""
    try:
        with socket.create_connection(addr, timeout=timeout) as s:
            s.sendall(raw)
            while chunk := s.recv(65536):
                reply += chunk
    except OSError:
        pass
    line = reply.split(b"\r\n", 1)[0].split()
    return (int(line[1]) if len(line) > 1 and line[1].isdigit() else 0), reply


def _post(path: str, body: bytes, sid: str | None = None) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n" \
           f"Connection: close\r\n"
    if sid is not None:
        head += f"X-Session-ID: {sid}\r\n"
    return head.encode() + b"\r\n" + body


def _served(server: OrsServer) -> bool:
    try:
        return bool(OrsEnvironment(server.url, "parallel", read_timeout_s=10,
                                   retries=2).task_ids(Split.TRAIN))
    except Exception:  # noqa: BLE001 - not served is the finding
        return False


def _traced_peak(run) -> int:
    """The peak of Python's allocations over a baseline while `run()` runs (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _at_once(requests: list[bytes], addr) -> list[int]:
    statuses: list[int] = []
    barrier = threading.Barrier(len(requests), timeout=60)

    def one(raw):
        barrier.wait()
        statuses.append(_send(addr, raw)[0])

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return statuses


def nested_empty_objects(tmp: str) -> tuple[Outcome, str]:
    """Four clients at once post bodies of 1.9 MiB of empty objects (`[{},{},...]`: ~25x
    their size once parsed) against an 8 MiB request-memory cap that counted bytes: the old
    server parsed all four, ~190 MiB. The memory it holds must stay within the cap."""
    cap = 8 << 20
    n = (19 << 20) // 10 // 3
    body = b'{"split": "train", "x": [' + b",".join([b"{}"] * n) + b"]}"
    requests = [_post("/parallel/tasks", body) for _ in range(4)]
    with OrsServer([_PAR], limits=_limits(cap)) as server:
        statuses: list[int] = []
        peak = _traced_peak(lambda: statuses.extend(_at_once(requests, server.address)))
        served = _served(server)
    detail = (f"4 bodies of {len(body) >> 10} KiB of empty objects: replies "
              f"{sorted(statuses)}; peak {peak >> 20} MiB against the {cap >> 20} MiB cap; "
              f"served after: {served}")
    if peak > cap + SLACK_BYTES or 500 in statuses or not served:
        return C, detail
    return B, detail


def held_heads(tmp: str) -> tuple[Outcome, str]:
    """40 clients each send a request line and 60 header lines of 60 KiB, and never the blank
    line that ends them (3.5 MiB each): request bodies had a global cap, heads none. The memory
    the server holds must stay within the cap."""
    cap, clients, lines = 8 << 20, 40, 60
    line = b"X-Pad: " + b"a" * (60 << 10) + b"\r\n"
    with OrsServer([_PAR], limits=_limits(cap)) as server:
        socks: list[socket.socket] = []

        def attack():
            for _ in range(clients):
                s = socket.create_connection(server.address, timeout=10)
                socks.append(s)
                try:
                    s.sendall(b"POST /parallel/tasks HTTP/1.1\r\nHost: x\r\n")
                except OSError:
                    continue
            for s in socks:
                try:
                    for _ in range(lines):
                        s.sendall(line)
                except OSError:
                    pass  # refused and closed: the rest was not read
            time.sleep(1.0)  # the server reads what was sent

        peak = _traced_peak(attack)
        refused = 0
        for s in socks:
            s.settimeout(2)
            try:
                refused += s.recv(64).startswith(b"HTTP/1.1 4")
            except OSError:
                pass
            s.close()
        served = _served(server)
    detail = (f"{clients} heads of {lines} x 60 KiB held open: {refused} refused with a 4xx; "
              f"peak {peak >> 20} MiB against the {cap >> 20} MiB cap; served after: {served}")
    if peak > cap + SLACK_BYTES or not served:
        return C, detail
    return B, detail


class _Trickle:
    """Slow clients: `n` connections, each sending a request's head one byte per round (0.3 s)
    and opening a new connection whenever the server closes one."""

    def __init__(self, addr, n: int):
        self.addr, self.n = addr, n
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        try:
            s = socket.create_connection(self.addr, timeout=5)
            s.sendall(b"POST /parallel/tasks HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
            self.opened += 1
            return s
        except OSError:
            return None

    def _run(self) -> None:
        socks = [self._open() for _ in range(self.n)]
        while not self.stop.is_set():
            for i, s in enumerate(socks):
                alive = s is not None
                if alive:
                    try:
                        s.recv(1 << 16)
                        alive = False  # a reply or the end: refused, or taken back
                    except BlockingIOError:
                        pass
                    except OSError:
                        alive = False
                if alive:
                    try:
                        s.send(b"X")
                    except OSError:
                        alive = False
                if not alive:
                    if s is not None:
                        s.close()
                    socks[i] = self._open()
            self.stop.wait(0.3)
        for s in socks:
            if s is not None:
                s.close()


def slow_clients(tmp: str) -> tuple[Outcome, str]:
    """48 slow clients trickle their heads against 32 connection slots (each reconnecting
    when closed) while an honest client makes 20 requests, one after the other, each on a
    new connection: with every slot held, the old server answered honest clients 503 most of
    the time. Each must be served (200) within 3 s."""
    with OrsServer([_PAR], limits=_limits(256 << 20, max_connections=32)) as server:
        slow = _Trickle(server.address, 48)
        slow.thread.start()
        time.sleep(2.0)  # every slot taken
        served, slowest = 0, 0.0
        for _ in range(20):
            start = time.monotonic()
            conn = http.client.HTTPConnection(*server.address, timeout=3)
            try:
                conn.request("GET", "/health")
                served += conn.getresponse().status == 200
            except OSError:
                pass
            finally:
                conn.close()
            slowest = max(slowest, time.monotonic() - start)
        slow.stop.set()
        slow.thread.join(10)
        refused, evicted = server.refused, getattr(server, "evicted", 0)
    detail = (f"20 honest requests among 48 slow clients on 32 slots: {served} served, the "
              f"slowest in {slowest:.2f} s ({slow.opened} slow connections opened; "
              f"{evicted} taken back, {refused} refused)")
    if served < 20 or slowest > 3.0:
        return C, detail
    return B, detail


class _GatedSession:
    """A session whose tool waits for the attack's gate, counting the calls that started."""

    task = Task("gate-train-0", "Work.", (ToolSpec("work", "work a while"),
                                          ToolSpec("rest", "rest a while")), 1000.0,
                Objective.SUM)

    def __init__(self, env):
        self.env = env

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        self.env.started.append(time.monotonic())
        self.env.gate.wait(10)
        return ToolOutcome(str(len(ctx.workspace.listdir("."))))

    def on_end(self, ctx):
        return FinalOutcome()


class _GatedEnv:
    name = "gate"
    uses_workspace = True

    def __init__(self):
        self.gate = threading.Event()
        self.started: list[float] = []

    def task_ids(self, split):
        return ("gate-train-0",)

    def task(self, task_id, clock_s=None):
        return _GatedSession.task

    def session(self, task_id, seed, clock_s=None):
        return _GatedSession(self)

    def vocabulary(self):
        return ()


def delete_during_calls(tmp: str) -> tuple[Outcome, str]:
    """A session mirrors a workspace; one call is inside the environment, a second (of another
    tool) waits behind it for the session (its workspace not yet restored), and the client
    deletes the session. The old
    server removed the directory at once, the first call's snapshot made it again, and the
    second call restored its files into it and ran: a directory outside every cap and the
    reaper, and a call of a deleted session. After the delete, no call may start and the
    directory must be gone."""
    env = _GatedEnv()
    files = {"files": {"a.txt": base64.b64encode(b"x").decode()}}
    calls_json = [json.dumps({"name": tool, "input": {}, "avalon": {
        "ctx": {"agent": "ceo", "title": "CEO", "clock_s": 0.0, "tokens_out": 0},
        "workspace": files}}).encode() for tool in ("work", "rest")]
    with OrsServer([env]) as server:
        sid = uuid.uuid4().hex
        status, reply = _send(server.address, _post(
            "/create", b'{"task_spec": {"task_id": "gate-train-0"}, "avalon": 1}', sid))
        if status != 200:
            return C, f"create answered {status}: {reply[-120:]!r}"
        root = server._sessions[sid].root
        replies: list[int] = []
        calls = [threading.Thread(target=lambda body=body: replies.append(_send(
            server.address, _post("/gate/call", body, sid))[0]), daemon=True)
            for body in calls_json]
        calls[0].start()
        deadline = time.monotonic() + 10
        while not env.started and time.monotonic() < deadline:
            time.sleep(0.01)
        calls[1].start()
        time.sleep(0.3)  # the second call waits for the session
        deleted_at = time.monotonic()
        deleted: list[int] = []
        deleter = threading.Thread(target=lambda: deleted.append(_send(
            server.address, _post("/delete", b"{}", sid))[0]), daemon=True)
        deleter.start()
        time.sleep(0.5)
        env.gate.set()
        for t in (*calls, deleter):
            t.join(30)
        time.sleep(0.2)
        left = os.path.isdir(root)
        after = sum(t > deleted_at for t in env.started)
    detail = (f"delete answered {deleted}, calls {sorted(replies)}; calls started after the "
              f"delete: {after}; the session's directory {'left' if left else 'gone'}")
    if left or after or deleted != [200]:
        return C, detail
    return B, detail


def non_finite_numbers(tmp: str) -> tuple[Outcome, str]:
    """Numbers past a double in request bodies (`1e400`, `-1e999`, an integer of 400
    digits), where the routes read them and where they ignore them: the old server answered
    the `clock_s` of a task spec with a 500. Every one must be a 4xx."""
    big = "9" * 400
    bodies = [
        ("/create", '{"task_spec": {"task_id": "parallel-train-0", "clock_s": 1e400}}'),
        ("/create", '{"task_spec": {"task_id": "parallel-train-0", "clock_s": -1e999}}'),
        ("/create", f'{{"task_spec": {{"task_id": "parallel-train-0", "seed": {big}}}}}'),
        ("/create", '{"split": "train", "index": 1e400}'),
        ("/parallel/tasks", '{"split": "train", "x": [1e400]}'),
        ("/parallel/avalon/task", '{"task_id": "parallel-train-0", "clock_s": 1e309}'),
    ]
    with OrsServer([_PAR]) as server:
        got = [(path, _send(server.address, _post(path, body.encode(), uuid.uuid4().hex))[0])
               for path, body in bodies]
        served = _served(server)
    statuses = [s for _, s in got]
    detail = f"{len(bodies)} requests: {statuses}; served after: {served}"
    if any(not 400 <= s < 500 for s in statuses) or not served:
        return C, detail
    return B, detail


ATTACKS = [
    Attack("ors: 4 bodies of empty objects (25x their bytes parsed) at once",
           nested_empty_objects),
    Attack("ors: 40 heads of 3.5 MiB held open", held_heads),
    Attack("ors: 48 slow clients on 32 slots, an honest one among them", slow_clients),
    Attack("ors: /delete while a call runs and another waits", delete_during_calls),
    Attack("ors: numbers past a double in request bodies", non_finite_numbers),
]
