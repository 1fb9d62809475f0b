"""The HTTP interface: the wire forms, the server and the client's errors. (Each environment's
own suite also runs over HTTP; this file covers what is specific to the transport.)"""

import json
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from avalon.envs import wire
from avalon.envs.base import Split, UnknownTaskError
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.http_client import EnvRequestError, EnvServerError, HttpEnvironment
from avalon.envs.http_server import EnvServer, ServerLimits
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.wealth import Wealth, WealthConfig
from avalon.org.env import ToolError
from avalon.org.workspace import Workspace
from tests.envs.helpers import Direct

PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))


@pytest.fixture(scope="module")
def served():
    with EnvServer(PAR) as server:
        yield server, HttpEnvironment(server.url)


@pytest.mark.parametrize("local", [
    PAR, HiddenProfile(ProfileConfig(n_train=4, n_heldout=2)),
    Wealth(WealthConfig(n_train=4, n_heldout=2)),
    SoftwareBuild(SoftwareConfig(n_train=4, n_heldout=2))], ids=lambda e: e.name)
def test_tasks_survive_the_wire(local):
    for tid in local.task_ids(Split.TRAIN):
        task = local.task(tid)
        assert wire.task_from_json(json.loads(json.dumps(wire.task_to_json(task)))) == task
    with EnvServer(local) as server:
        remote = HttpEnvironment(server.url)
        assert remote.name == local.name and remote.uses_workspace == local.uses_workspace
        assert remote.vocabulary() == local.vocabulary()
        for split in Split:
            assert remote.task_ids(split) == local.task_ids(split)
        tid = local.task_ids(Split.HELDOUT)[1]
        assert remote.task(tid, 123.0) == local.task(tid, 123.0)


def test_sessions_close_after_end_and_on_request(served):
    server, env = served
    tid = env.task_ids(Split.TRAIN)[0]
    d = Direct(env, tid)
    assert server.open_sessions == 1
    d.end()
    assert server.open_sessions == 0
    with pytest.raises(EnvServerError, match="404 unknown_session"):
        d.call("solve", id="s1", answer=1)
    s = env.session(tid, 0)
    s.close()
    assert server.open_sessions == 0


def test_errors_keep_their_kind(served):
    _, env = served
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
    d.end()


def test_environment_bugs_are_reported_and_the_server_survives():
    class Buggy(ParallelSubtasks):
        def session(self, task_id, seed, clock_s=None):
            s = super().session(task_id, seed, clock_s)
            s.call = lambda tool, args, ctx: 1 / 0
            return s

    with EnvServer(Buggy(ParallelConfig(n_train=2, n_heldout=1))) as server:
        env = HttpEnvironment(server.url)
        d = Direct(env, env.task_ids(Split.TRAIN)[0])
        with pytest.raises(EnvServerError, match="500 env_error: ZeroDivisionError"):
            d.call("solve", id="s1", answer=1)
        assert env.task_ids(Split.TRAIN)  # still serving


def test_dead_server_and_bad_urls():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(EnvServerError, match="unreachable"):
        HttpEnvironment(f"http://127.0.0.1:{port}", timeout_s=2.0)
    with pytest.raises(ValueError, match="must start with http"):
        HttpEnvironment("127.0.0.1:80")
    server = EnvServer(PAR).start()
    env = HttpEnvironment(server.url)
    session = env.session(env.task_ids(Split.TRAIN)[0], 0)
    server.close()  # the server dies mid-rollout
    with pytest.raises(EnvServerError, match="unreachable"):
        session.brief("ceo", 0, "CEO", "")


class _Fake(BaseHTTPRequestHandler):
    reply = b"not json"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)


@pytest.mark.parametrize("reply, match", [
    (b"not json", "reply is not JSON"), (b"[1, 2]", "not a JSON object"),
    (b'{"name": "x", "uses_workspace": "yes", "vocabulary": []}',
     "field 'uses_workspace' has str"),
    (b'{"name": "x", "vocabulary": []}', "missing field 'uses_workspace'")])
def test_bad_replies_are_named(reply, match):
    handler = type("Fake", (_Fake,), {"reply": reply})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        with pytest.raises(EnvServerError, match=match):
            HttpEnvironment(f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_server_refuses_bad_bodies(served):
    server, env = served
    import http.client
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    for body, match in ((b'{"task_id": "parallel-train-0", "seed": NaN}', "NaN"),
                        (b"[1]", "JSON object"), (b'{"task_id": 3, "seed": 0}', "task_id"),
                        (b'{"task_id": "parallel-train-0", "seed": true}', "seed")):
        conn.request("POST", "/sessions", body=body)
        resp = conn.getresponse()
        reply = json.loads(resp.read())
        assert resp.status == 400 and reply["kind"] == "bad_request" and match in reply["error"]
    conn.request("GET", "/nowhere")
    resp = conn.getresponse()
    assert resp.status == 404 and json.loads(resp.read())["kind"] == "not_found"
    conn.close()
    assert server.open_sessions == 0


def test_max_sessions():
    with EnvServer(PAR, limits=ServerLimits(max_sessions=2)) as server:
        env = HttpEnvironment(server.url)
        tid = env.task_ids(Split.TRAIN)[0]
        env.session(tid, 0), env.session(tid, 1)
        with pytest.raises(EnvRequestError, match="2 sessions are open"):
            env.session(tid, 2)


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
