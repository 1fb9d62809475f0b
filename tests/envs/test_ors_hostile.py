"""The ORS server and client (with the Avalon extension, docs/ors_extension.md) against hostile or
broken peers, as the red team's list has them: strict Content-Length, stalled clients, bursts of 200
clients, deep JSON, abandoned sessions, and workspaces that sandboxed code left in a state no
snapshot can hold. Every wait is bounded by a timeout."""

import base64
import http.client
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from avalon.envs import wire
from avalon.envs.base import Split
from avalon.envs.ors import EnvRequestError, EnvServerError
from avalon.envs.ors_server import OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.transport import ServerLimits
from avalon.org.env import (
    CallContext,
    EndContext,
    EndReason,
    FinalOutcome,
    Param,
    ParamType,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.workspace import Workspace
from avalon.rl.types import Objective
from tests.envs.helpers import served
from tests.org.helpers import call, events_of, run_playbook, step

PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))



def _raw_reply(sock: socket.socket) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one reply read from a raw socket (its timeout bounds it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a reply: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-reply"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:n]


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed the connection (EOF or reset) within the socket timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def server():
    with OrsServer([PAR], limits=ServerLimits(read_timeout_s=1.0, head_timeout_s=1.0,
                                              session_ttl_s=900.0)) as s:
        yield s


@pytest.mark.parametrize("headers, status", [
    ("Content-Length: -1", 400),
    ("Content-Length: +5", 400),
    ("Content-Length: abc", 400),
    ("Content-Length: 99999999999999999999999", 400),
    ("Content-Length: 5\r\nContent-Length: 7", 400),
    ("Transfer-Encoding: chunked", 411),
    ("", 411),  # no Content-Length at all
    (f"Content-Length: {70 << 20}", 413),
], ids=["negative", "signed", "not-a-number", "huge", "repeated", "chunked", "missing",
        "over-cap"])
def test_content_length_is_strict_and_the_body_is_never_read(server, headers, status):
    """The reply comes before a byte of the body is sent (the server cannot have read it), is
    a JSON 4xx, and the connection is closed so the unread body is never parsed as a request.
    The old server read a `-1` body until EOF (70 MiB past its cap) and never answered."""
    with socket.create_connection(server.address, timeout=5) as sock:
        extra = f"{headers}\r\n" if headers else ""
        sock.sendall(f"POST /create HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
        got, reply_headers, body = _raw_reply(sock)
        assert got == status, body
        assert json.loads(body)["kind"] == "bad_request"
        assert reply_headers.get("connection") == "close"
        try:  # the attacker's 70 MiB: the server is not reading it
            sock.settimeout(2)
            sock.sendall(b"x" * (70 << 20))
            sent_all = True
        except OSError:
            sent_all = False
        assert not sent_all or _closed_by_peer(sock)
    assert served(server, "parallel").task_ids(Split.TRAIN)  # still serving


def test_clients_that_stall_are_dropped(server):
    """50 clients send headers and no body (and 5 drip their headers a byte at a time): each is
    dropped once its request is 1 s late, while others are served. The old server held them
    open for as long as they liked."""
    stalled = []
    for _ in range(50):
        s = socket.create_connection(server.address, timeout=5)
        s.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        stalled.append(s)
    drips = [socket.create_connection(server.address, timeout=5) for _ in range(5)]
    start = time.monotonic()
    env = served(server, "parallel", read_timeout_s=5)
    assert env.task_ids(Split.TRAIN)  # served while 55 are stalled
    for _ in range(6):  # 1.5 s of dripping, 0.25 s a byte
        for s in drips:
            try:
                s.sendall(b"G")
            except OSError:
                pass
        time.sleep(0.25)
    try:
        assert all(_closed_by_peer(s) for s in stalled + drips)
        assert time.monotonic() - start < 5
    finally:
        for s in stalled + drips:
            s.close()


def _timed_connect(addr: tuple[str, int]) -> float:
    """Connects, checks that GET /health is answered, and returns how long the connect took."""
    start = time.monotonic()
    with socket.create_connection(addr, timeout=30) as sock:
        took = time.monotonic() - start
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, _ = _raw_reply(sock)
    assert status == 200
    return took


def test_200_concurrent_clients_without_a_reset():
    """200 clients connect at once (a barrier) and each plays a whole session. No connection
    may be dropped: a SYN that finds the listen queue full is dropped (or reset, with
    tcp_abort_on_overflow) and retried after Linux's 1 s SYN timeout, so on loopback a connect
    over 1 s is a dropped one, however loaded the machine (the kernel answers SYNs, not the
    server's threads). The old server's backlog of 5 dropped most of them."""
    n = 200
    with OrsServer([PAR]) as srv:
        tid = PAR.task_ids(Split.TRAIN)[0]
        barrier = threading.Barrier(n, timeout=30)
        errors: list[str] = []
        connects: list[float] = []
        finished = []

        def client(i: int) -> None:
            try:
                barrier.wait()
                connects.append(_timed_connect(srv.address))
                env = served(srv, "parallel", read_timeout_s=30)
                session = env.session(tid, i)
                with tempfile.TemporaryDirectory() as tmp:
                    ws = Workspace(tmp)
                    session.on_start(0, ws)
                    session.brief("ceo", 0, "CEO", "")
                    ctx = CallContext("ceo", "CEO", 0.0, 0, ws)
                    with pytest.raises(ToolError):
                        session.call("solve", {"id": "s999", "answer": 1}, ctx)
                    session.on_end(EndContext(EndReason.FINAL_MESSAGE, "x", 0.0, ws))
                finished.append(i)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not errors, f"{len(errors)} of {n} failed, e.g. {errors[:3]}"
        assert len(finished) == n
        dropped = sorted(c for c in connects if c >= 1.0)
        assert not dropped, f"{len(dropped)} of {n} connects were dropped and retried"
        assert srv.open_sessions == 0


def test_deep_and_malformed_json_are_400(server):
    """Python's parser raises RecursionError on deep input: that was a 500; now any malformed
    body is a 400 and the server keeps serving."""
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    bodies = {
        "deep": b'{"task_spec": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        "deep-args": json.dumps({"name": "solve", "input": {"x": json.loads("[" * 100 + "]" * 100)},
                                 "avalon": {"ctx": {}}}).encode(),
        "not-utf8": b'{"task_spec": {"task_id": "\xff\xfe"}, "avalon": 1}',
        "truncated": b'{"task_spec": {"task_id": "parallel-train-0", "seed": ',
    }
    for name, body in bodies.items():
        path = "/parallel/call" if name == "deep-args" else "/create"
        conn.request("POST", path, body=body, headers={"X-Session-ID": "0000"})
        resp = conn.getresponse()
        reply = json.loads(resp.read())
        assert resp.status == 400 and reply["kind"] == "bad_request", (name, reply)
    conn.close()
    assert server.open_sessions == 0


def test_idle_sessions_expire_and_no_longer_lock_out_new_ones():
    """64 abandoned sessions fill the table; once they have been idle for the TTL they are
    reaped and a new session opens. A session in use is never reaped, and a reaped one answers
    404. (The old server refused every new session forever.) A full table of fresh sessions
    refuses the next one (checked with a long TTL: how fast a loaded machine opens 64 sessions
    must not matter)."""
    with OrsServer([PAR], limits=ServerLimits(max_sessions=64, session_ttl_s=900.0)) as srv:
        env = served(srv, "parallel")
        tid = env.task_ids(Split.TRAIN)[0]
        opened = [env.session(tid, i) for i in range(64)]
        with pytest.raises(EnvRequestError, match="64 sessions are open"):
            env.session(tid, 100)  # all 64 are fresh
        for session in opened:  # their pings stop (a test process must not keep 64 threads)
            session.close()
    with OrsServer([PAR], limits=ServerLimits(max_sessions=64, session_ttl_s=2.0)) as srv:
        env = served(srv, "parallel")
        abandoned = [env.session(tid, i) for i in range(63)]
        kept = env.session(tid, 99)
        until = time.monotonic() + 2.5  # every abandoned one is idle past the TTL by then
        while time.monotonic() < until:  # `kept` stays in use meanwhile
            time.sleep(0.2)
            kept.brief("ceo", 0, "CEO", "")
        fresh = env.session(tid, 101)  # reaps the 63 idle ones (some maybe earlier)
        assert srv.open_sessions == 2 and srv.reaped == 63
        kept.brief("ceo", 0, "CEO", "")
        with pytest.raises(EnvServerError, match="404 unknown_session.*idle over 2 s"):
            abandoned[0].brief("ceo", 0, "CEO", "")
        for session in (fresh, kept, *abandoned):
            session.close()  # a reaped one's delete is a 404, passed over


# ----- workspaces left by sandboxed code, mirrored by the extension -----

COUNT = ToolSpec("count", "count the workspace's files", (Param("note", ParamType.STRING,
                                                                required=False),))


class _FilesSession:
    def __init__(self):
        self._task = Task("files-train-0", "Count files.", (COUNT,), 1000.0, Objective.SUM)

    @property
    def task(self):
        return self._task

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        return ToolOutcome(str(len(ctx.workspace.listdir("."))))

    def on_end(self, ctx):
        names = ctx.workspace.listdir(".")
        return FinalOutcome(metrics={"files": float(len(names)),
                                     "has_link": float("link.py" in names)})


class FilesEnv:
    """Counts the files of the workspace it is shown (uses_workspace)."""
    name = "files"
    uses_workspace = True

    def task_ids(self, split):
        return ("files-train-0",) if split is Split.TRAIN else ("files-heldout-0",)

    def task(self, task_id, clock_s=None):
        return _FilesSession().task

    def session(self, task_id, seed, clock_s=None):
        return _FilesSession()

    def vocabulary(self):
        return ()


def _hostile_workspace(root: str, *, over_limits: bool, link: bool) -> None:
    """What a run_code program can leave: files past the total cap, a link that inside the
    sandbox points at the workspace but in the trainer at the trainer's working directory, a
    FIFO, a directory link."""
    if over_limits:
        for i in range(20):  # 20 MiB against the 16 MiB cap, each file at the 1 MiB cap
            with open(os.path.join(root, f"big{i:02d}.bin"), "wb") as f:
                f.write(b"\0" * (1 << 20))
    if link:
        os.symlink("/proc/self/cwd/setup.py", os.path.join(root, "link.py"))
        os.symlink("/proc/self/cwd", os.path.join(root, "cwd"))
        os.mkfifo(os.path.join(root, "notes.txt"))
    with open(os.path.join(root, "solution.py"), "w") as f:
        f.write("x = 1\n")


def test_a_workspace_over_the_caps_is_a_tool_error_in_a_call_and_graded_at_the_end():
    """Files past the total cap (left by code that escaped the caps, or put there by hand):
    the old client sent them, the server refused with a 400 and the driver crashed."""
    with OrsServer([FilesEnv()]) as srv, tempfile.TemporaryDirectory() as tmp:
        env = served(srv, "files", read_timeout_s=30)
        session = env.session("files-train-0", 0)
        ws = Workspace(tmp)
        session.on_start(0, ws)
        _hostile_workspace(tmp, over_limits=True, link=False)
        ctx = CallContext("ceo", "CEO", 0.0, 0, ws)
        with pytest.raises(ToolError, match="cannot be sent to the environment: 'big16.bin'"):
            session.call("count", {}, ctx)
        final = session.on_end(EndContext(EndReason.FINAL_MESSAGE, "x", 0.0, ws))
        assert final.metrics["files"] == 16  # what fits the 16 MiB cap is graded
        assert srv.open_sessions == 0


def test_links_and_fifos_never_travel_and_never_crash_the_end():
    """A link that inside the sandbox points at the workspace but in the trainer at its working
    directory, a directory link, a FIFO: the old client raised ToolError out of the driver at
    the end. Now they are not part of the workspace, as for the file tools in-process."""
    with OrsServer([FilesEnv()]) as srv, tempfile.TemporaryDirectory() as tmp:
        env = served(srv, "files", read_timeout_s=30)
        session = env.session("files-train-0", 0)
        ws = Workspace(tmp)
        session.on_start(0, ws)
        _hostile_workspace(tmp, over_limits=False, link=True)
        ctx = CallContext("ceo", "CEO", 0.0, 0, ws)
        assert session.call("count", {}, ctx).text == "1"  # solution.py only
        final = session.on_end(EndContext(EndReason.FINAL_MESSAGE, "x", 0.0, ws))
        assert final.metrics == {"files": 1.0, "has_link": 0.0}
        assert srv.open_sessions == 0
        assert os.path.exists(os.path.join(tmp, "notes.txt"))  # nothing of the client's removed


def test_a_rollout_whose_code_leaves_a_proc_cwd_link_and_too_many_bytes_finishes():
    """Through the driver over ORS: run_code writes 20 MiB and a /proc/self/cwd link, then
    an environment call, then the end. The old client raised out of the driver at the end."""
    code = ("import os\n"
            "for i in range(20):\n"
            "    open(f'big{i:02d}.bin', 'wb').write(b'0' * (1 << 20))\n"
            "os.symlink('/proc/self/cwd/setup.py', 'link.py')\n")
    steps = {"ceo": [step(call("roster")),
                     step(call("write_file", path="evil.py", text=code)),
                     step(call("run_code", path="evil.py")),
                     step(call("count")),
                     step(call("final_message", text="done"))]}
    with OrsServer([FilesEnv()]) as srv:
        session = served(srv, "files", read_timeout_s=30).session("files-train-0", 0)
        result, _, events = run_playbook(session, steps, budget=0)
    assert events_of(events, "end")
    count = events_of(events, "tool_call", tool="count")
    ran = events_of(events, "tool_call", tool="run_code")
    assert count and ran
    assert count[0]["error"] or ran[0]["error"]  # one of them refused the workspace
    assert srv.open_sessions == 0


def test_snapshot_of_hostile_trees_never_raises_and_never_follows_links():
    """Deep trees, links to outside, names that are not UTF-8: only nameable regular files."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(tmp)
        deep = tmp
        for _ in range(80):  # past max_depth
            deep = os.path.join(deep, "d")
            os.mkdir(deep)
        Path(deep, "f.py").touch()
        os.symlink("/etc", os.path.join(tmp, "etc"))
        os.symlink("/etc/hostname", os.path.join(tmp, "hostname"))
        Path(tmp, os.fsdecode(b"bad\xff.py")).touch()  # not UTF-8: a surrogate escape
        Path(tmp, "ok.py").write_text("1")
        snap, left_out = wire.snapshot(ws)
        assert list(snap["files"]) == ["ok.py"] and left_out == []
        with tempfile.TemporaryDirectory() as copy:
            restored = Workspace(copy)
            wire.restore(restored, snap)
            assert restored.listdir(".") == ["ok.py"]


def test_restore_never_writes_through_a_link():
    """A directory that is a link to outside the workspace: the link is replaced by a real
    directory and nothing lands outside; a FIFO where a file goes is replaced by the file."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as outside:
        ws = Workspace(tmp)
        os.symlink(outside, os.path.join(tmp, "d"))
        os.mkfifo(os.path.join(tmp, "y"))
        data = base64.b64encode(b"owned").decode()
        wire.restore(ws, {"files": {"d/x": data}})
        assert os.listdir(outside) == []
        assert not Path(tmp, "d").is_symlink() and Path(tmp, "d", "x").read_bytes() == b"owned"
        wire.restore(ws, {"files": {"y": data}})
        assert Path(tmp, "y").read_bytes() == b"owned"  # the FIFO was replaced
        for bad, match in (("a" * 300, "300 bytes"), ("\ud800.py", "surrogate"),
                           ("a//b", "canonical"), ("/abs", "absolute"), ("../x", "'..'")):
            with pytest.raises(wire.WireError, match=match):
                wire.restore(ws, {"files": {bad: data}})
        with pytest.raises(wire.WireError, match="both a file and a directory"):
            wire.restore(ws, {"files": {"p": data, "p/q": data}})


def test_an_idle_kept_alive_connection_is_closed_and_the_client_reconnects():
    """The server closes a connection idle past read_timeout_s; the client's next requests
    (a brief, a call, the end: none idempotent) each run once, on a fresh connection."""
    briefs = []

    class Counting(ParallelSubtasks):
        def session(self, task_id, seed, clock_s=None):
            s = super().session(task_id, seed, clock_s)
            brief = s.brief
            s.brief = lambda *a: briefs.append(a) or brief(*a)
            return s

    limits = ServerLimits(read_timeout_s=0.3, session_ttl_s=900.0)
    with OrsServer([Counting(ParallelConfig(n_train=4, n_heldout=2))], limits=limits) as srv:
        env = served(srv, "parallel", read_timeout_s=5)
        tid = env.task_ids(Split.TRAIN)[0]
        session = env.session(tid, 0)
        with tempfile.TemporaryDirectory() as tmp:
            ws = Workspace(tmp)
            session.on_start(0, ws)
            time.sleep(0.8)  # the server drops the idle connection meanwhile
            session.brief("ceo", 0, "CEO", "")
            ctx = CallContext("ceo", "CEO", 0.0, 0, ws)
            out = session.call("solve", {"id": "s1", "answer": 0}, ctx)
            assert isinstance(out, ToolOutcome)
            time.sleep(0.8)
            session.on_end(EndContext(EndReason.FINAL_MESSAGE, "x", 0.0, ws))
        assert srv.open_sessions == 0 and len(briefs) == 1
