"""Red-team attacks: the ORS environment server and client, with the Avalon extension that
mirrors workspaces (docs/ors_extension.md; first written against Avalon's earlier
in-house protocol).

Every server listens on 127.0.0.1 (an ephemeral port) and every wait has a timeout. An attack
is blocked when the server refuses it cleanly (a 4xx, a dropped connection) and keeps serving,
a tool error when the agents' doing becomes a tool error, and a crash when it hangs, resets
honest clients, answers 500 or raises out of the driver.
"""

import http.client
import json
import select
import socket
import tempfile
import threading
import time

from avalon.envs.base import Split
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import ORS_LIMITS, OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.transport import ServerLimits
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.env import (
    CallContext,
    EndContext,
    EndReason,
    FinalOutcome,
    Task,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from avalon.org.workspace import Workspace
from avalon.rl.types import Objective
from avalon.tokenizer import ByteTokenizer, ChatFormat
from experiments.security.outcome import Attack, Outcome

_PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))



def _client(server: OrsServer, name: str = "parallel", timeout_s: float = 30.0):
    """An honest client: `OrsEnvironment` with the Avalon extension."""
    return OrsEnvironment(server.url, name, extension=True, read_timeout_s=timeout_s)


def _status_line(sock: socket.socket) -> tuple[str, bytes]:
    """The first reply line, or '' if none came before the socket's timeout or EOF."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionError):
        pass
    return data.split(b"\r\n", 1)[0].decode("latin-1"), data


def negative_content_length(tmp: str) -> tuple[Outcome, str]:
    """`Content-Length: -1` and a 70 MiB body: the old server read it all, past its cap."""
    with OrsServer([_PAR]) as server, socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        sent = [0]

        def flood():
            try:
                for _ in range(70):
                    s.sendall(b"x" * (1 << 20))
                    sent[0] += 1
            except OSError:
                pass

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        start = time.monotonic()
        line, data = _status_line(s)
        took = time.monotonic() - start
        t.join(timeout=10)
        alive = bool(_client(server, timeout_s=5).task_ids(Split.TRAIN))
    if line.split()[1:2] == ["400"] and b"onnection: close" in data and alive:
        return Outcome.BLOCKED, (f"400 after {took * 1000:.0f} ms with the body unread "
                                 f"({sent[0]} of 70 MiB sent before the close)")
    return Outcome.CRASH, f"no refusal in {took:.1f} s ({line!r}); {sent[0]} MiB taken"


def headers_without_body(tmp: str) -> tuple[Outcome, str]:
    """50 clients send headers and no body; the old server held them open for good."""
    limits = ORS_LIMITS
    with OrsServer([_PAR]) as server:
        held = []
        for _ in range(50):
            s = socket.create_connection(server.address, timeout=5)
            s.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            held.append(s)
        start = time.monotonic()
        served = bool(_client(server, timeout_s=5).task_ids(Split.TRAIN))
        open_ = set(held)
        deadline = start + limits.read_timeout_s + 5
        while open_ and time.monotonic() < deadline:  # a dropped one reads as EOF or reset
            readable, _, _ = select.select(list(open_), [], [], 0.5)
            for s in readable:
                try:
                    s.recv(1)
                except ConnectionResetError:
                    pass
                open_.discard(s)
        took = time.monotonic() - start
        for s in held:
            s.close()
    dropped = 50 - len(open_)
    if dropped == 50 and served:
        return Outcome.BLOCKED, (f"all 50 dropped after {took:.1f} s (read_timeout_s "
                                 f"{limits.read_timeout_s:g}); others served meanwhile")
    return Outcome.CRASH, f"{dropped}/50 dropped in {took:.1f} s; others served: {served}"


def _connect_and_get(addr: tuple[str, int]) -> float:
    """Connects (timed), sends GET /health and reads the reply; returns the connect time."""
    start = time.monotonic()
    with socket.create_connection(addr, timeout=30) as s:
        took = time.monotonic() - start
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        line, _ = _status_line(s)
    if line.split()[1:2] != ["200"]:
        raise ConnectionError(f"GET /health answered {line!r}")
    return took


def _concurrent(n: int) -> tuple[Outcome, str]:
    """n clients connect at once, then each plays a session. A full listen queue drops SYNs
    (Linux; or resets, with tcp_abort_on_overflow): a dropped one is retried after 1 s, so a
    connect that takes over 1 s on loopback is a dropped connection."""
    errors: list[str] = []
    connects: list[float] = []
    with OrsServer([_PAR]) as server:
        tid = _PAR.task_ids(Split.TRAIN)[0]
        barrier = threading.Barrier(n, timeout=60)

        def client(i: int) -> None:
            try:
                barrier.wait()
                connects.append(_connect_and_get(server.address))
                env = _client(server)
                session = env.session(tid, i)
                with tempfile.TemporaryDirectory() as ws_dir:
                    ws = Workspace(ws_dir)
                    session.on_start(0, ws)
                    session.brief("ceo", 0, "CEO", "")
                    session.on_end(EndContext(EndReason.FINAL_MESSAGE, "x", 0.0, ws))
            except Exception as e:  # noqa: BLE001 - each failure is the finding
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    dropped = sum(c >= 1.0 for c in connects)
    detail = (f"{n - len(errors)}/{n} sessions played; {dropped} connects dropped and retried "
              f"(slowest connect {max(connects, default=0) * 1000:.0f} ms)")
    if not errors and not dropped and len(connects) == n:
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail + (f"; e.g. {errors[0]}" if errors else "")


def deep_json(tmp: str) -> tuple[Outcome, str]:
    """200,000 nested arrays: Python's parser raises RecursionError (the old server: 500)."""
    body = b'{"avalon": 1, "task_spec": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with OrsServer([_PAR]) as server, socket.create_connection(server.address, timeout=10) as s:
        s.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nX-Session-ID: deep\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        line, _ = _status_line(s)
    if line.split()[1:2] == ["400"]:
        return Outcome.BLOCKED, f"{line.split(' ', 1)[1]}"
    return Outcome.CRASH, f"answered {line!r}"


def _abandon(server: OrsServer, n: int, prefix: str) -> list[int]:
    """Creates `n` sessions with the extension, as a client that never pings or deletes them;
    returns the statuses."""
    tid = _PAR.task_ids(Split.TRAIN)[0]
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    body = json.dumps({"task_spec": {"task_id": tid, "seed": 0}, "avalon": 1})
    statuses = []
    try:
        for i in range(n):
            conn.request("POST", "/create", body, {"X-Session-ID": f"{prefix}-{i}"})
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
    finally:
        conn.close()
    return statuses


def idle_sessions(tmp: str) -> tuple[Outcome, str]:
    """4,096 abandoned sessions (the table's size); the old server then refused every new one
    forever. Two servers: with the default 900 s TTL the full table of fresh sessions must
    refuse the next one; with a 20 s TTL (to keep the attack short), once every abandoned
    session has been idle for it, all are reaped and a new one opens (some may be reaped while
    a loaded machine is still filling the table: every one must be, in the end)."""
    n = ORS_LIMITS.max_sessions
    with OrsServer([_PAR]) as server:
        start = time.monotonic()
        statuses = _abandon(server, n, "fresh")
        filled = time.monotonic() - start
        opened = server.open_sessions
        refused_while_fresh = _abandon(server, 1, "one-more") == [400]
    limits = ServerLimits(session_ttl_s=20.0)
    with OrsServer([_PAR], limits=limits) as server:
        statuses += _abandon(server, n, "abandoned")
        last = time.monotonic()
        time.sleep(max(0.0, last + limits.session_ttl_s + 0.2 - time.monotonic()))
        start = time.monotonic()
        try:
            _client(server).session(_PAR.task_ids(Split.TRAIN)[0], -2).close()
        except Exception as e:  # noqa: BLE001 - a refusal is the finding
            return Outcome.CRASH, f"new session refused after {n} idle ones: {e}"
        took = time.monotonic() - start
        reaped, left = server.reaped, server.open_sessions
    detail = (f"{opened} sessions open at once (filling took {filled:.1f} s; the next refused "
              f"while fresh: {refused_while_fresh}); with a {limits.session_ttl_s:g} s TTL "
              f"{reaped} of {n} abandoned reaped, {left} left, the next opened in "
              f"{took * 1000:.0f} ms")
    if (opened == n and refused_while_fresh and set(statuses) == {200} and reaped == n
            and left == 0):
        return Outcome.BLOCKED, detail
    return Outcome.CRASH, detail + f"; statuses {sorted(set(statuses))}"


# ----- a workspace sandboxed code left behind, mirrored by the extension at the end -----

_COUNT = ToolSpec("count", "count the workspace's files")


class _FilesSession:
    task = Task("files-train-0", "Count files.", (_COUNT,), 1000.0, Objective.SUM)

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx: CallContext) -> ToolOutcome:
        return ToolOutcome(str(len(ctx.workspace.listdir("."))))

    def on_end(self, ctx):
        return FinalOutcome(metrics={"files": float(len(ctx.workspace.listdir(".")))})


class _FilesEnv:
    name = "files"
    uses_workspace = True

    def task_ids(self, split):
        return ("files-train-0",)

    def task(self, task_id, clock_s=None):
        return _FilesSession.task

    def session(self, task_id, seed, clock_s=None):
        return _FilesSession()

    def vocabulary(self):
        return ()


def _episode(code: str) -> tuple[Outcome, str]:
    """The CEO runs `code`, calls the environment, ends: all through the driver, over ORS."""
    def step(*calls):
        return Step("", tuple(calls))
    steps = {"ceo": [step(("roster", {})),
                     step(("write_file", {"path": "evil.py", "text": code})),
                     step(("run_code", {"path": "evil.py"})),
                     step(("count", {})),
                     step(("final_message", {"text": "done"}))]}
    chat = ChatFormat(ByteTokenizer())
    with OrsServer([_FilesEnv()]) as server:
        session = _client(server, "files").session("files-train-0", 0)
        driver = RolloutDriver(ScriptedPolicy(chat, Playbook(steps)), chat,
                               OrgConfig.scaled(8192))
        try:
            result = driver.run([GroupSpec(0, (RolloutSpec(session, 0, 0),))])
        except Exception as e:  # noqa: BLE001 - an exception out of the driver is the crash
            return Outcome.CRASH, f"the driver raised {type(e).__name__}: {e}"
    events = result.logs[0][0].events
    errors = [e for e in events if e["kind"] == "tool_call" and e.get("error")]
    ended = any(e["kind"] == "end" for e in events)
    if not ended:
        return Outcome.CRASH, "the episode did not end"
    if errors:
        return Outcome.TOOL_ERROR, (f"episode ended; tool errors: "
                                    f"{', '.join(e['tool'] for e in errors)}")
    return Outcome.BLOCKED, "episode ended; the snapshot left the hostile files out"


def workspace_over_limits(tmp: str) -> tuple[Outcome, str]:
    return _episode("for i in range(20):\n"
                    "    open(f'big{i:02d}.bin', 'wb').write(b'0' * (1 << 20))\n")


def proc_cwd_link(tmp: str) -> tuple[Outcome, str]:
    return _episode("import os\nos.symlink('/proc/self/cwd/setup.py', 'link.py')\n"
                    "os.symlink('/proc/self/cwd', 'cwd')\n")


ATTACKS = [
    Attack("ors: Content-Length -1 with a 70 MiB body", negative_content_length),
    Attack("ors: 50 clients send headers and no body", headers_without_body),
    Attack("ors: 50 concurrent clients", lambda tmp: _concurrent(50)),
    Attack("ors: 200 concurrent clients", lambda tmp: _concurrent(200)),
    Attack("ors: JSON nested 200,000 deep", deep_json),
    Attack("ors: 4,096 abandoned sessions, then a new one", idle_sessions),
    Attack("ors: workspace over the limits at episode end", workspace_over_limits),
    Attack("ors: /proc/self/cwd link at episode end", proc_cwd_link),
]
