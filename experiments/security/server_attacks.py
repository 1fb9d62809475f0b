"""Red-team attacks: the ORS environment server's global limits. Every server
listens on 127.0.0.1 and every wait has a timeout.

BLOCKED: the server held its limit (refused the excess with 503, or cleaned up) and kept
serving; CRASH: the limit did not hold (more sessions than `max_sessions`, a thread per
connection without end, bodies held past any bound, a dead server's directories left for good).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid

from avalon.envs.base import Split
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.transport import ServerLimits
from avalon.org.env import FinalOutcome, Task, ToolOutcome, ToolSpec
from experiments.security.outcome import Attack, Outcome

_PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))


class _SlowStart:
    """A session whose on_start takes a while (a repository checked out, an image pulled)."""

    task = Task("slowstart-train-0", "Wait.", (ToolSpec("noop", "nothing"),), 100.0)

    def on_start(self, budget, workspace):
        time.sleep(0.5)

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        return ToolOutcome("ok")

    def on_end(self, ctx):
        return FinalOutcome()


class _SlowStartEnv:
    name = "slowstart"
    uses_workspace = False

    def task_ids(self, split):
        return ("slowstart-train-0",)

    def task(self, task_id, clock_s=None):
        return _SlowStart.task

    def session(self, task_id, seed, clock_s=None):
        return _SlowStart()

    def vocabulary(self):
        return ()



def _post(addr, path: str, body: dict, headers: dict | None = None,
          timeout: float = 60) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
                  f"Connection: close\r\n{head}\r\n".encode() + data)
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    line = reply.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 else 0, reply


def ors_sessions_race(tmp: str) -> tuple[Outcome, str]:
    """120 concurrent creates against max_sessions = 20, each on_start taking 0.5 s: the old
    server checked the count before on_start and inserted after, so all 120 got through."""
    n, cap = 120, 20
    with OrsServer([_SlowStartEnv()], limits=ServerLimits(session_ttl_s=900.0,
                                                          max_sessions=cap)) as server:
        addr = server.address
        statuses: list[int] = []
        barrier = threading.Barrier(n, timeout=60)

        def create():
            barrier.wait()
            status, _ = _post(addr, "/create", {"split": "train", "index": 0},
                              {"X-Session-ID": uuid.uuid4().hex})
            statuses.append(status)

        threads = [threading.Thread(target=create, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        opened = server.open_sessions
    made = statuses.count(200)
    detail = f"{made} of {n} creates succeeded, {opened} sessions open, max_sessions {cap}"
    if made <= cap and opened <= cap and len(statuses) == n:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail


_DYING_SERVER = """
import json, sys
from avalon.envs.ors_server import OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.ors import OrsEnvironment
server = OrsServer([ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))]).start()
env = OrsEnvironment(server.url, "parallel", ping_s=60.0)
sessions = [env.session(env.task_ids(__import__("avalon.envs.base").envs.base.Split.TRAIN)[i], 0)
            for i in range(3)]
print(json.dumps([e.root for e in server._sessions.values()]), flush=True)
sys.stdin.read()  # killed here
"""


def leftover_session_dirs(tmp: str) -> tuple[Outcome, str]:
    """An ORS server with three open sessions is killed with SIGKILL; a new server starts
    (both in a private TMPDIR): the dead server's session directories must be gone."""
    tmpdir = os.path.join(tmp, "tmpdir")
    os.makedirs(tmpdir)
    env = {**os.environ, "TMPDIR": tmpdir, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", _DYING_SERVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        roots = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    alive_after_kill = sum(os.path.isdir(r) for r in roots)
    start = ("from avalon.envs.ors_server import OrsServer\n"
             "from avalon.envs.parallel import ParallelSubtasks\n"
             "OrsServer([ParallelSubtasks()]).close()\n")
    subprocess.run([sys.executable, "-c", start], env=env, check=True, timeout=120)
    left = [r for r in roots if os.path.isdir(r)]
    detail = (f"{len(roots)} session directories of the killed server ({alive_after_kill} "
              f"left by the kill); after a new server started: {len(left)}")
    if roots and not left:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail


def _limit(name: str, default: int) -> int:
    """A global cap's default (the code before them had none: then the issue's numbers)."""
    return getattr(ServerLimits(), name, default)


def _answered_503(socks: list[socket.socket]) -> int:
    """How many of `socks` have a 503 reply waiting: read as they arrive until none has come
    for 0.5 s (5 s at most; a loaded machine's accept loop answers the excess over time, and
    one poll saw only those answered by then)."""
    poller = select.poll()  # not select(): descriptors past 1024
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    count = 0
    deadline = time.monotonic() + 5.0
    while by_fd and time.monotonic() < deadline:
        ready = poller.poll(500)
        if not ready:
            break
        for fd, _ in ready:
            s = by_fd.pop(fd)
            poller.unregister(fd)
            s.setblocking(False)
            try:
                count += s.recv(64).startswith(b"HTTP/1.1 503")
            except OSError:
                pass
    return count


def connections_cap(tmp: str) -> tuple[Outcome, str]:
    """700 clients connect and send half a request (each holds a server thread until the read
    timeout): past `max_connections` (512 by default) a new one must get a 503 at once and no
    thread, and the server must still serve the next client once they go."""
    n = 700
    with OrsServer([_PAR]) as server:
        addr = server.address
        held, refused = [], 0
        before = threading.active_count()
        for _ in range(n):
            s = socket.create_connection(addr, timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the headers never end
            held.append(s)
        # Until the server has taken every connection (a thread each, or a 503): a loaded
        # machine's accept loop lags the clients. Within the 10 s read timeout, which would
        # start dropping the first ones.
        deadline = time.monotonic() + 8.0
        while server.connections + server.refused < n and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the last accepted connections' threads start
        threads = threading.active_count() - before
        refused = _answered_503(held)
        for s in held:
            s.close()
        time.sleep(0.5)
        served = bool(OrsEnvironment(server.url, "parallel", extension=True,
                                     read_timeout_s=10).task_ids(Split.TRAIN))
    detail = (f"{n} half-open connections: {threads} server threads, {refused} answered 503; "
              f"served after: {served}")
    cap = _limit("max_connections", 512)
    if threads <= cap + 8 and refused >= n - cap - 8 and served:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail


def inflight_bodies(tmp: str) -> tuple[Outcome, str]:
    """16 clients each send 55 MiB of a 55 MiB + 1 body and stall (the server holds what it
    read until the read timeout): the old server held all 880 MiB."""
    n, size = 16, 55 << 20
    chunk = b"x" * (1 << 20)
    with OrsServer([_PAR]) as server:
        addr = server.address
        socks, refused, sent = [], 0, 0
        for _ in range(n):
            s = socket.create_connection(addr, timeout=10)
            s.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                      % (size + 1))
            socks.append(s)
        for s in socks:
            try:
                for _ in range(size // len(chunk)):
                    s.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # refused and closed: the rest was not read
                pass
        time.sleep(0.5)
        refused = _answered_503(socks)
        held = getattr(server, "inflight_request_bytes",  # named for bodies only before
                       getattr(server, "inflight_body_bytes", None))
        for s in socks:
            s.close()
    cap = _limit("max_inflight_request_bytes", 256 << 20)
    accepted = n - refused
    detail = (f"{n} bodies of 55 MiB: {refused} refused with 503, {accepted} read "
              f"({accepted * 55} MiB against the {cap >> 20} MiB cap)")
    if accepted * size <= cap and held is not None and held <= cap:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail


class _Slow:
    """A call that lasts until the attack opens `gate`: every call is then in flight at once,
    however slowly a loaded machine starts the clients."""

    task = Task("slow-train-0", "Wait.", (ToolSpec("nap", "sleep a while"),), 100.0)
    gate = threading.Event()
    entered = 0
    lock = threading.Lock()

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        with _Slow.lock:
            _Slow.entered += 1
        _Slow.gate.wait(30)
        return ToolOutcome("rested")

    def on_end(self, ctx):
        return FinalOutcome()


class _SlowEnv(_SlowStartEnv):
    name = "slow"

    def task_ids(self, split):
        return ("slow-train-0",)

    def task(self, task_id, clock_s=None):
        return _Slow.task

    def session(self, task_id, seed, clock_s=None):
        return _Slow()


def worker_threads_cap(tmp: str) -> tuple[Outcome, str]:
    """300 sessions each start a call that lasts until all 300 have started or been refused
    (30 s at most): past `max_worker_threads` (256) the ORS server must answer 503 rather than
    start a thread per call."""
    n = 300
    _Slow.gate.clear()
    _Slow.entered = 0
    with OrsServer([_SlowEnv()]) as server:
        addr = server.address
        sids = [uuid.uuid4().hex for _ in range(n)]
        for sid in sids:
            status, _ = _post(addr, "/create", {"split": "train", "index": 0},
                              {"X-Session-ID": sid})
            if status != 200:
                return Outcome.CRASH, f"create answered {status}"
        statuses: list[int] = []
        peak = [0]
        base = threading.active_count()

        def call(sid):
            status, _ = _post(addr, "/slow/call", {"name": "nap", "input": {}},
                              {"X-Session-ID": sid})
            statuses.append(status)

        threads = [threading.Thread(target=call, args=(sid,), daemon=True) for sid in sids]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        try:
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
                peak[0] = max(peak[0], getattr(server, "workers", -1))
                if _Slow.entered + statuses.count(503) >= n:
                    _Slow.gate.set()
                time.sleep(0.05)
        finally:
            _Slow.gate.set()
        for t in threads:
            t.join(5)
        active = threading.active_count() - base
    cap = _limit("max_worker_threads", 256)
    ok, busy = statuses.count(200), statuses.count(503)
    detail = (f"{n} calls at once: {ok} ran, {busy} answered 503; peak worker threads "
              f"{peak[0]} (cap {cap})")
    if 0 <= peak[0] <= cap and ok + busy == n and busy >= n - cap and active < 50:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail


ATTACKS = [
    Attack("ors: 120 concurrent creates, max_sessions 20, slow on_start", ors_sessions_race),
    Attack("ors: sessions' directories after kill -9", leftover_session_dirs),
    Attack("ors: 700 half-open connections", connections_cap),
    Attack("ors: 16 bodies of 55 MiB held open", inflight_bodies),
    Attack("ors: 300 slow calls at once", worker_threads_cap),
]

