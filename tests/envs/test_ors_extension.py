"""The Avalon extension of ORS (docs/ors_extension.md): the wire forms, what an extended
`OrsEnvironment` carries that plain ORS does not (the environment's own tasks, ids and
vocabulary, per-agent briefs, the caller and its clock, the hire budget, the end's reason and
the final outcome with its wealth ratio, metrics and record, workspaces), the errors' kinds,
and the server's refusals of malformed extension requests. (Each environment's own suite also
runs over ORS with the extension: `tests/envs/helpers.py`.)"""

import http.client
import json
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from avalon.envs import wire
from avalon.envs.base import Split, UnknownTaskError
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.ors import EnvRequestError, EnvServerError, OrsEnvironment
from avalon.envs.ors_server import ORS_LIMITS, OrsServer
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.transport import ServerLimits
from avalon.envs.verification import Verification, VerificationConfig
from avalon.envs.wealth import Wealth, WealthConfig
from avalon.org.env import CallContext, EndContext, EndReason, ToolError, ToolOutcome
from avalon.org.workspace import Workspace
from tests.envs.helpers import Direct, served
from tests.envs.test_ors_server import answers

PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))


@pytest.fixture(scope="module")
def server():
    with OrsServer([PAR]) as s:
        yield s, served(s, "parallel")


def _post(server, path: str, body: bytes, sid: str | None = None) -> tuple[int, dict]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"X-Session-ID": sid} if sid else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("local", [
    PAR, HiddenProfile(ProfileConfig(n_train=4, n_heldout=2)),
    Wealth(WealthConfig(n_train=4, n_heldout=2)),
    SoftwareBuild(SoftwareConfig(n_train=4, n_heldout=2))], ids=lambda e: e.name)
def test_tasks_survive_the_wire(local):
    for tid in local.task_ids(Split.TRAIN):
        task = local.task(tid)
        assert wire.task_from_json(json.loads(json.dumps(wire.task_to_json(task)))) == task
    with OrsServer([local]) as srv:
        remote = served(srv, local.name)
        assert remote.name == local.name and remote.uses_workspace == local.uses_workspace
        assert remote.vocabulary() == local.vocabulary()
        for split in Split:
            assert remote.task_ids(split) == local.task_ids(split)
        tid = local.task_ids(Split.HELDOUT)[1]
        assert remote.task(tid, 123.0) == local.task(tid, 123.0)
        session = remote.session(tid, 3, 77.0)
        assert session.task == local.session(tid, 3, 77.0).task
        session.close()


class _Recording(ParallelSubtasks):
    """ParallelSubtasks whose sessions record what the organisation's side told them."""

    seen: list = []

    def session(self, task_id, seed, clock_s=None):
        s = super().session(task_id, seed, clock_s)
        seen = self.seen
        start, brief, call, end = s.on_start, s.brief, s.call, s.on_end
        s.on_start = lambda budget, ws: (seen.append(("start", budget)), start(budget, ws))[1]
        s.brief = lambda *a: (seen.append(("brief", *a)), brief(*a))[1]
        s.call = lambda tool, args, ctx: (seen.append(
            ("call", tool, ctx.agent, ctx.title, ctx.clock_s, ctx.tokens_out)),
            call(tool, args, ctx))[1]
        s.on_end = lambda ctx: (seen.append(
            ("end", ctx.reason, ctx.final_message, ctx.latency_s)), end(ctx))[1]
        return s


def test_what_plain_ors_lacks_reaches_the_environment():
    """The budget, each agent's brief request, the caller with its clock and tokens, the end's
    reason, message and latency: exactly what the in-process organisation passes."""
    env = _Recording(ParallelConfig(n_train=2, n_heldout=1))
    ref = ParallelSubtasks(ParallelConfig(n_train=2, n_heldout=1))
    env.seen.clear()
    with OrsServer([env]) as srv:
        remote = served(srv, env.name)
        tid = remote.task_ids(Split.TRAIN)[0]
        with tempfile.TemporaryDirectory() as tmp:
            ws = Workspace(tmp)
            session = remote.session(tid, 0)
            session.on_start(3, ws)
            brief = session.brief("a2", 2, "Analyst", "checks s2")
            assert brief == ref.session(tid, 0).brief("a2", 2, "Analyst", "checks s2")
            with pytest.raises(ToolError, match="no subtask 's99'"):
                session.call("solve", {"id": "s99", "answer": 1},
                             CallContext("a2", "Analyst", 412.5, 37, ws))
            final = session.on_end(EndContext(EndReason.WALL_CLOCK, None, 1234.0, ws))
            want = ref.session(tid, 0).on_end(EndContext(EndReason.WALL_CLOCK, None, 1234.0, ws))
    assert env.seen == [("start", 3), ("brief", "a2", 2, "Analyst", "checks s2"),
                        ("call", "solve", "a2", "Analyst", 412.5, 37),
                        ("end", EndReason.WALL_CLOCK, None, 1234.0)]
    assert final == want


@pytest.mark.parametrize("local", [Wealth(WealthConfig(n_train=2, n_heldout=1)),
                                   Verification(VerificationConfig(n_train=2, n_heldout=1))],
                         ids=lambda e: e.name)
def test_final_outcomes_cross_whole(local):
    """The final rewards, the wealth ratio, the metrics and the record (ground truth for the
    analysis) of an extended end equal the in-process ones."""
    tid = local.task_ids(Split.TRAIN)[0]
    with OrsServer([local]) as srv:
        got = Direct(served(srv, local.name), tid, seed=1, budget=2).end(EndReason.WALL_CLOCK)
    want = Direct(local, tid, seed=1, budget=2).end(EndReason.WALL_CLOCK)
    assert got == want
    assert got.metrics and (got.wealth_ratio is not None or got.record)


def test_sessions_close_after_end_and_on_request(server):
    srv, env = server
    tid = env.task_ids(Split.TRAIN)[0]
    d = Direct(env, tid)
    assert srv.open_sessions == 1
    d.end()
    assert srv.open_sessions == 0
    with pytest.raises(EnvServerError, match="status 404 unknown_session"):
        d.call("solve", id="s1", answer=1)
    s = env.session(tid, 0)
    s.close()
    assert srv.open_sessions == 0


def test_errors_keep_their_kind(server):
    _, env = server
    with pytest.raises(UnknownTaskError, match="no task 'parallel-train-99'"):
        env.session("parallel-train-99", 0)
    with pytest.raises(EnvRequestError, match="field 'seed' has str"):  # refused by the server
        env.session(env.task_ids(Split.TRAIN)[0], "7")
    assert issubclass(EnvRequestError, ValueError)  # like in-process refusals
    with pytest.raises(ValueError, match="clock_s must be a number > 0"):
        env.task(env.task_ids(Split.TRAIN)[0], clock_s=0)
    d = Direct(env, env.task_ids(Split.TRAIN)[0])
    with pytest.raises(ToolError, match="no subtask 's42'"):  # a result, not a failure
        d.call("solve", id="s42", answer=3)
    with pytest.raises(ToolError, match="'teleport' is not a valid tool"):
        d.call("teleport")
    d.end()


def test_environment_bugs_are_reported_and_the_server_survives():
    """A bug (an exception other than ToolError) is the server's failure, never a tool result:
    `event: error` in a call, a 500 `env_error` elsewhere, and neither is retried (it would
    run again)."""
    runs = []

    class Buggy(ParallelSubtasks):
        def session(self, task_id, seed, clock_s=None):
            s = super().session(task_id, seed, clock_s)
            s.call = lambda tool, args, ctx: runs.append("call") or 1 / 0
            s.brief = lambda *a: runs.append("brief") or 1 / 0
            return s

    with OrsServer([Buggy(ParallelConfig(n_train=2, n_heldout=1))]) as srv:
        env = served(srv, "parallel")
        d = Direct(env, env.task_ids(Split.TRAIN)[0])
        with pytest.raises(EnvServerError, match="environment failed.*ZeroDivisionError"):
            d.call("solve", id="s1", answer=1)
        with pytest.raises(EnvServerError, match="status 500 env_error: ZeroDivisionError"):
            d.session.brief("a1", 1, "Dev", "x")
        assert runs == ["call", "brief"]
        assert env.task_ids(Split.TRAIN)  # still serving
        d.end()


def test_dead_server_and_bad_urls():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(EnvServerError, match="unreachable"):
        OrsEnvironment(f"http://127.0.0.1:{port}", "parallel", retries=1, backoff_s=0.01)
    with pytest.raises(ValueError, match="must start with http"):
        OrsEnvironment("127.0.0.1:80", "parallel")
    srv = OrsServer([PAR]).start()
    env = served(srv, "parallel", retries=1, backoff_s=0.01)
    session = env.session(env.task_ids(Split.TRAIN)[0], 0)
    srv.close()  # the server dies mid-rollout
    with pytest.raises(EnvServerError, match="unreachable"):
        session.brief("ceo", 0, "CEO", "")


class _Fake(BaseHTTPRequestHandler):
    """Plain ORS answers, and `extension` for the extension's probe."""

    extension = b""

    def log_message(self, *a):
        pass

    def do_GET(self):
        reply = {"/list_environments": b'["x"]', "/x/splits": b'["train", "test"]',
                 "/x/avalon": self.extension}.get(self.path, b"")
        self.send_response(200 if reply else 404)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.mark.parametrize("reply, match", [
    (b"not json", "reply is not JSON"), (b"[1, 2]", "expected a JSON object"),
    (b'{"extension": "avalon", "version": 1, "name": "x", "uses_workspace": "yes", '
     b'"vocabulary": []}', "field 'uses_workspace' has str"),
    (b'{"extension": "avalon", "version": 1, "name": "x", "vocabulary": []}',
     "missing field 'uses_workspace'"),
    (b'{"extension": "avalon", "version": 2, "name": "x", "uses_workspace": false, '
     b'"vocabulary": []}', "version 2"),
    (b"", "does not offer the avalon extension")])
def test_bad_extension_replies_are_named(reply, match):
    handler = type("Fake", (_Fake,), {"extension": reply})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises((EnvServerError, ValueError), match=match):
            OrsEnvironment(url, "x", extension=True)
        if not reply:  # no extension: plain ORS unless it is required
            assert OrsEnvironment(url, "x").extension is None
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_server_refuses_bad_extension_requests(server):
    srv, env = server
    tid = env.task_ids(Split.TRAIN)[0]
    for body, match in (
            (b'{"task_spec": {"task_id": "parallel-train-0", "seed": NaN}, "avalon": 1}', "NaN"),
            (b"[1]", "JSON object"),
            (b'{"task_spec": {"task_id": 3}, "avalon": 1}', "task_id"),
            (b'{"task_spec": {"task_id": "parallel-train-0", "seed": true}, "avalon": 1}',
             "seed"),
            (b'{"task_spec": {"task_id": "parallel-train-0"}, "avalon": 2}', "'avalon' must be 1"),
            (b'{"task_spec": {"task_id": "parallel-train-0"}, "avalon": true}', "'avalon'")):
        status, reply = _post(srv, "/create", body, sid="bad")
        assert status == 400 and reply["kind"] == "bad_request" and match in reply["error"], \
            (body, reply)
    plain = OrsEnvironment(srv.url, "parallel", extension=False).session(tid, 0)
    status, reply = _post(srv, "/parallel/avalon/start", b'{"budget": 1}', sid=plain.sid)
    assert status == 400 and "without the avalon extension" in reply["error"]
    status, reply = _post(srv, "/parallel/call", json.dumps(
        {"name": "solve", "input": {}, "avalon": {"ctx": {}}}).encode(), sid=plain.sid)
    assert status == 400 and "'avalon'" in reply["error"]
    plain.close()
    d = Direct(env, tid)
    sid = d.session.sid
    for path, body, match in (
            ("/parallel/call", {"name": "solve", "input": {}}, "'avalon' is required"),
            ("/parallel/call", {"name": "solve", "input": {}, "avalon": {"ctx": {"agent": 1}}},
             "field 'agent' has int"),
            ("/parallel/avalon/brief", {"agent": "a1", "index": "1", "title": "t", "role": "r"},
             "field 'index' has str"),
            ("/parallel/avalon/start", {"budget": 1.5}, "field 'budget' has float"),
            ("/parallel/avalon/teleport", {}, "no extension route")):
        status, reply = _post(srv, path, json.dumps(body).encode(), sid=sid)
        assert status in (400, 404) and match in reply["error"], (path, reply)
    status, reply = _post(srv, "/parallel/avalon/brief", b"{}", sid="nope")
    assert status == 404 and reply["kind"] == "unknown_session"
    status, reply = _post(srv, "/parallel/avalon/end", b'{"ctx": {"reason": "bored"}}', sid=sid)
    assert status == 400 and "reason" in reply["error"]
    assert srv.open_sessions == 0  # a malformed end still closes the session
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/nowhere")
    resp = conn.getresponse()
    assert resp.status == 404 and json.loads(resp.read())["kind"] == "not_found"
    conn.close()


def test_max_sessions():
    with OrsServer([PAR], limits=ServerLimits(max_sessions=2,
                                              session_ttl_s=ORS_LIMITS.session_ttl_s)) as srv:
        env = served(srv, "parallel")
        tid = env.task_ids(Split.TRAIN)[0]
        env.session(tid, 0), env.session(tid, 1)
        with pytest.raises(EnvRequestError, match="2 sessions are open"):
            env.session(tid, 2)


def test_a_terminal_outcome_leaves_the_end_to_the_organisation(server):
    """Extended, a terminal outcome does not end the episode on the server (as in-process: the
    organisation ends it, with its own reason and latency)."""
    _, env = server
    tid = env.task_ids(Split.TRAIN)[0]
    d = Direct(env, tid)
    local = Direct(PAR, tid)
    prompt = PAR.task(tid).prompt
    outs = [(d.call("solve", id=sid, answer=v), local.call("solve", id=sid, answer=v))
            for sid, v in answers(prompt)]
    assert [a for a, _ in outs] == [b for _, b in outs] and outs[-1][0].terminal
    assert isinstance(outs[0][0], ToolOutcome)
    assert d.end(EndReason.ENV_TERMINAL) == local.end(EndReason.ENV_TERMINAL)


def test_workspace_snapshots():
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        src, dst = Workspace(a), Workspace(b)
        src.write("solution.py", "x = 1\n")
        src.write("pkg/data.txt", "caf\u00e9")
        (src.root / "blob.bin").write_bytes(bytes(range(256)))
        dst.write("stale.py", "old")
        wire.restore(dst, wire.snapshot(src)[0])
        assert dst.listdir(".") == ["blob.bin", "pkg/data.txt", "solution.py"]
        assert (dst.root / "blob.bin").read_bytes() == bytes(range(256))
        assert dst.read("pkg/data.txt") == "caf\u00e9"
        for bad in ("../escape.py", "/etc/x", "a/../../x"):
            with pytest.raises(wire.WireError, match="workspace snapshot"):
                wire.restore(dst, {"files": {bad: ""}})
        with pytest.raises(wire.WireError, match="not valid base64"):
            wire.restore(dst, {"files": {"a.py": "!!"}})
