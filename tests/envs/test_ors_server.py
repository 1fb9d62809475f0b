"""Avalon environments served over ORS (`OrsServer`, `python -m avalon.envs.serve`): listed,
opened and played by the `openreward` SDK's own client, with the same rewards as in-process;
replay by task_id, one call at a time per session, episode_finished, and the hardened
transport's refusals on the ORS routes."""

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

openreward = pytest.importorskip("openreward")
os.environ["OPENREWARD_DISABLE_UPDATE_CHECK"] = "1"

from openreward.api.errors import ToolCallError  # noqa: E402

from avalon.envs.base import Split, TaskTable  # noqa: E402
from avalon.envs.ors import EnvServerError, OrsEnvironment  # noqa: E402
from avalon.envs.ors_server import OrsServer  # noqa: E402
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks  # noqa: E402
from avalon.envs.parallel.tasks import Op  # noqa: E402
from avalon.envs.transport import ServerLimits  # noqa: E402
from avalon.org.env import FinalOutcome, Task, ToolOutcome, ToolSpec  # noqa: E402
from tests.envs.helpers import Direct, run_teacher, word_chat  # noqa: E402
from tests.envs.test_ors_client import ROOT, free_port, wait_healthy  # noqa: E402

PAR = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))
SUBTASK = re.compile(r"(s\d+) (add|sub|mul|max|min) (-?\d+) (-?\d+)")


def answers(prompt: str) -> list[tuple[str, int]]:
    return [(sid, Op(op).apply(int(a), int(b))) for sid, op, a, b in SUBTASK.findall(prompt)]


def sdk_env(url: str, name: str, variant: str | None = None):
    """The SDK's client; `variant` picks one environment of a server serving several (the
    bare routes are the first one's)."""
    client = openreward.OpenReward(api_key="loopback-test")
    return client, client.environments.get(name=name, variant=variant, base_url=url)


def test_the_sdk_client_lists_opens_and_plays_an_avalon_environment():
    with OrsServer([PAR]) as server:
        with urllib.request.urlopen(server.url + "/list_environments", timeout=5) as r:
            assert json.loads(r.read()) == ["parallel"]
        client, env = sdk_env(server.url, "parallel")
        try:
            assert env.list_splits() == ["train", "heldout"]
            assert env.num_tasks("train") == 4
            assert [t.task_spec for t in env.list_tasks("heldout")] == [
                {"task_id": i} for i in PAR.task_ids(Split.HELDOUT)]
            tid = PAR.task_ids(Split.TRAIN)[1]
            with env.session(split="train", index=1) as s:
                prompt = s.get_prompt()[0].text
                assert prompt.startswith(PAR.task(tid).prompt)
                assert [t.name for t in s.list_tools()] == [t.name for t in PAR.task(tid).tools]
                assert s.terminal_tool().name == "final_message"
                got = [s.call_tool("solve", {"id": sid, "answer": value}).reward
                       for sid, value in answers(prompt)[:-1]]  # the last would finish it
                final = s.call_terminal_tool("done")
                assert final.finished
                with pytest.raises(ToolCallError, match="episode_finished"):
                    s.call_tool("solve", {"id": "s1", "answer": 0})
            assert server.open_sessions == 0  # the SDK deleted it
        finally:
            client.environments.close()
    # The reference: the same calls in-process.
    d = Direct(PAR, tid)
    want = []
    for sid, value in answers(PAR.task(tid).prompt)[:-1]:
        out = d.call("solve", id=sid, answer=value)
        want.append(sum(r.value for r in out.rewards) if out.rewards else None)
    want_final = d.end()
    assert got == want and any(v for v in want)
    assert final.reward == sum(r.value for r in want_final.rewards)


class SlowCounter:
    """A tiny Avalon environment whose `bump` reads, waits, then writes (racy unless calls are
    serialised) and counts its runs."""

    name = "slowcounter"
    uses_workspace = False

    def __init__(self):
        self.table = TaskTable("slowcounter", lambda rng: int(rng.integers(2, 5)), lambda s: s,
                               n_train=2, n_heldout=1, seed=0)
        self.runs = []

    def task_ids(self, split):
        return self.table.ids(split)

    def task(self, task_id, clock_s=None):
        self.table.get(task_id)
        return Task(task_id, "bump it", (ToolSpec("bump", "add one"),), clock_s or 60.0)

    def session(self, task_id, seed, clock_s=None):
        return _CounterSession(self, self.task(task_id, clock_s))

    def vocabulary(self):
        return ("bump",)


class _CounterSession:
    def __init__(self, env, task):
        self.env, self.task, self.count = env, task, 0

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        start = time.monotonic()
        n = self.count
        time.sleep(0.3)
        self.count = n + 1
        self.env.runs.append((start, time.monotonic()))
        return ToolOutcome(f"count {self.count}", duration_s=5.0)

    def on_end(self, ctx):
        return FinalOutcome()


def test_parallel_calls_run_one_at_a_time_and_replays_do_not_rerun():
    env = SlowCounter()
    with OrsServer([env]) as server:
        remote = OrsEnvironment(server.url, "slowcounter", extension=False)  # plain ORS
        d = Direct(remote, "slowcounter-train-0")
        outs = []
        threads = [threading.Thread(target=lambda: outs.append(d.call("bump").text))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outs) == ["count 1", "count 2", "count 3"]
        spans = sorted(env.runs)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
        assert d.call("bump").duration_s == 5.0  # the declared duration crossed the wire
        # A raw client reads the task_id, hangs up, and re-POSTs it: the stored result, once.
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = json.dumps({"name": "bump", "input": {}})
        headers = {"X-Session-ID": d.session.sid, "Content-Type": "application/json"}
        conn.request("POST", "/slowcounter/call", body, headers)
        resp = conn.getresponse()
        first = resp.fp.readline() + resp.fp.readline()
        task_id = first.decode().split("data: ")[1].strip()
        conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/slowcounter/call",
                     json.dumps({"name": "bump", "input": {}, "task_id": task_id}), headers)
        text = conn.getresponse().read().decode()
        assert '"text":"count 5"' in text and "event: end" in text
        assert len(env.runs) == 5  # replayed (waiting for the run in flight): 5 runs, not 6
        d.end()
        assert server.open_sessions == 0


def test_orsenvironment_plays_the_parallel_teacher_like_in_process():
    with OrsServer([PAR]) as server:
        remote = OrsEnvironment(server.url, "parallel", wall_clock_s=PAR.config.clock_s,
                                extension=False)  # plain ORS (the extension: helpers.py)
        chat = word_chat(PAR)
        tids = PAR.task_ids(Split.TRAIN)[:2]
        got = run_teacher(PAR.teacher(chat), chat, [remote.session(t, 0) for t in tids], [0, 0])
        want = run_teacher(PAR.teacher(chat), chat, [PAR.session(t, 0) for t in tids], [0, 0])
    assert sum(len(w.rollouts[0].rewards) for w in want.groups) >= 2
    for g, w in zip(got.groups, want.groups):
        gr, wr = g.rollouts[0], w.rollouts[0]
        assert [(r.agent, r.value, r.label) for r in gr.rewards] == [
            (r.agent, r.value, r.label) for r in wr.rewards]
        assert gr.info["end_reason"] == wr.info["end_reason"]


def test_transport_refusals_on_the_ors_routes():
    limits = ServerLimits(max_body_bytes=1024, session_ttl_s=900.0)
    with OrsServer([PAR], limits=limits) as server:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)

        def post(path, body, headers=None):
            conn.request("POST", path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        assert post("/create", "{}")[0] == 400  # no X-Session-ID
        status, reply = post("/parallel/prompt", "{}", {"X-Session-ID": "nope"})
        assert status == 404 and reply["kind"] in ("not_found", "unknown_session")
        status, reply = post("/create", json.dumps({"split": "train", "index": 99}),
                             {"X-Session-ID": "s1"})
        assert status == 400 and "index 99 is out of range" in reply["detail"]
        status, reply = post("/create", "[" * 40 + "]" * 40, {"X-Session-ID": "s1"})
        assert status == 400
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        status, reply = post("/create", "x" * 2048, {"X-Session-ID": "s1"})
        assert status == 413
        assert server.open_sessions == 0


def make_envs():
    """For the command-line test: `--env=tests.envs.test_ors_server:make_envs`."""
    return [PAR, SlowCounter()]


def test_the_command_line_server():
    port = free_port()
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "avalon.envs.serve",
                             "--env=tests.envs.test_ors_server:make_envs", f"--port={port}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        with urllib.request.urlopen(url + "/list_environments", timeout=5) as r:
            assert json.loads(r.read()) == ["parallel", "slowcounter"]
        client, sdk = sdk_env(url, "slowcounter", variant="slowcounter")
        try:
            with sdk.session(split="train", index=0) as s:
                assert s.call_tool("bump", {}).blocks[0].text == "count 1"
        finally:
            client.environments.close()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"at http://127.0.0.1:{port}" in out.decode()
    with socket.socket() as s:  # loopback only: nothing listens on the other addresses
        s.settimeout(1)
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_pings_keep_an_open_rollout_alive_and_idle_sessions_are_reaped():
    limits = ServerLimits(session_ttl_s=1.0)
    with OrsServer([SlowCounter()], limits=limits) as server:
        pinged = OrsEnvironment(server.url, "slowcounter", ping_s=0.2)
        silent = OrsEnvironment(server.url, "slowcounter", ping_s=60.0)
        alive = Direct(pinged, "slowcounter-train-0")
        idle = Direct(silent, "slowcounter-train-1")
        time.sleep(1.6)
        Direct(silent, "slowcounter-train-1").end()  # a create runs the reaper
        assert server.reaped == 1
        assert alive.call("bump").text == "count 1"
        with pytest.raises(EnvServerError, match="status 404.*no open session"):
            idle.call("bump")
        alive.end()
