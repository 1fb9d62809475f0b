"""`OrsEnvironment` against an environment written with the `openreward` SDK and served by the
SDK itself on 127.0.0.1 (a subprocess; OPENREWARD_DISABLE_UPDATE_CHECK=1): rollouts of the org
driver, rewards and `finished` as reward and terminal events, a retried call that does not run
twice (a proxy cuts the stream after its task_id, or answers 503), and parallel agents' calls
to one tool serialised by the server."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openreward")

from avalon.envs.base import Split, UnknownTaskError  # noqa: E402
from avalon.envs.ors import EnvServerError, OrsEnvironment  # noqa: E402
from avalon.org import OrgConfig  # noqa: E402
from avalon.org.env import EndReason, ToolError  # noqa: E402
from tests.envs.helpers import Direct  # noqa: E402
from tests.org.helpers import call, events_of, run_playbook, step  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NO_PLAN = OrgConfig.scaled(8192, plan_mode=False)  # the CEO may call env tools at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SDK server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the SDK server at {url} did not come up in {timeout_s} s")


@pytest.fixture(scope="module")
def sdk_server(tmp_path_factory):
    """The SDK's own server for tests/envs/ors_counter_env.py: (url, log dir)."""
    log = tmp_path_factory.mktemp("ors-log")
    port = free_port()
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tests.envs.ors_counter_env", str(port),
                             str(log)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def runs(log: Path, kind: str) -> list[list[str]]:
    path = log / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    return [ln.split()[1:] for ln in lines if ln.split()[0] == kind]


class FlakyProxy:
    """A loopback TCP proxy that can answer the next /call requests with 503 (`refuse`) or cut
    their streams right after the `task_id` event (`cut`)."""

    def __init__(self, upstream: str):
        self.up = ("127.0.0.1", int(upstream.rsplit(":", 1)[1]))
        self.refuse = self.cut = 0
        self.calls_seen = 0
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        client.settimeout(30)
        first = client.recv(65536)
        is_call = b"/call " in first.split(b"\r\n", 1)[0]
        with self._lock:
            self.calls_seen += is_call
            refuse = is_call and self.refuse > 0
            cut = is_call and not refuse and self.cut > 0
            self.refuse -= refuse
            self.cut -= cut
        if refuse:
            client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                           b"Connection: close\r\n\r\n")
            client.close()
            return
        try:
            up = socket.create_connection(self.up, timeout=30)
            up.sendall(first)
        except OSError:  # the upstream server is gone (module teardown)
            client.close()
            return

        def pump_up():
            try:
                while data := client.recv(65536):
                    up.sendall(data)
            except OSError:
                pass
        threading.Thread(target=pump_up, daemon=True).start()
        seen = b""
        try:
            while data := up.recv(65536):
                client.sendall(data)
                seen += data
                rest = seen.split(b"event: task_id", 1)[1] if b"event: task_id" in seen else b""
                if cut and (b"\n\n" in rest or b"\r\n\r\n" in rest):  # the whole event
                    break
        except OSError:
            pass
        for s in (client, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.sock.close()


def test_tasks_prompt_and_tools(sdk_server):
    url, _ = sdk_server
    env = OrsEnvironment(url, "counter")
    assert env.task_ids(Split.TRAIN) == ("counter-train-0", "counter-train-1", "counter-train-2")
    assert env.task_ids(Split.HELDOUT) == ("counter-heldout-0", "counter-heldout-1")  # 'test'
    task = env.task("counter-train-1", clock_s=120.0)
    assert task.prompt == "bump the counter to 3 then submit done"
    assert task.wall_clock_s == 120.0
    tools = {t.name: t for t in task.tools}
    assert set(tools) == {"bump", "slow", "big", "declared", "boom"}  # submit: the terminal
    assert tools["slow"].signature() == "slow(tag)"
    assert tools["slow"].params[0].type.value == "string"
    with pytest.raises(UnknownTaskError, match="no task 'counter-train-3'"):
        env.session("counter-train-3", 0)
    with pytest.raises(ValueError, match="has no environment 'nope'"):
        OrsEnvironment(url, "nope")


def test_an_sdk_server_has_no_avalon_extension_and_plain_ors_is_spoken(sdk_server):
    """The extension's probe (`GET /counter/avalon`) is a 404 from the SDK's server: the client
    speaks plain ORS (no budget, briefs or workspace go out), and requiring the extension is a
    clear error (docs/ors_extension.md)."""
    url, _ = sdk_server
    env = OrsEnvironment(url, "counter")
    assert env.extension is None and env.uses_workspace is False
    assert env.name == "counter" and "bump" in env.vocabulary()
    d = Direct(env, "counter-train-0", budget=3)
    assert d.session.brief("a1", 1, "Dev", "x") == ""
    assert not d.call("bump").terminal
    out = d.call("bump")  # the target (2) reached: rewarded, finished
    assert [(r.value, r.label) for r in out.rewards] == [(1.0, "ors")] and out.terminal
    d.end()
    with pytest.raises(ValueError, match="does not offer the avalon extension"):
        OrsEnvironment(url, "counter", extension=True)


def test_rollouts_of_the_driver_get_rewards_and_terminal_events(sdk_server):
    url, _ = sdk_server
    env = OrsEnvironment(url, "counter")
    session = env.session("counter-train-0", 0)  # target 2
    result, _, events = run_playbook(session, {"ceo": [step(call("bump")), step(call("bump")),
                                                       step(call("bump"))]}, budget=0,
                                    config=NO_PLAN)
    calls = events_of(events, "tool_call", tool="bump")
    assert len(calls) == 2  # the episode ended at the second bump
    assert [c["rewards"] for c in calls] == [[{"value": 0.0, "label": "ors"}],
                                             [{"value": 1.0, "label": "ors"}]]
    assert all(c["measured"] for c in calls)  # no declared duration: the wall time
    end = events_of(events, "end")[0]
    assert end["reason"] == EndReason.ENV_TERMINAL.value
    rollout = result.groups[0].rollouts[0]
    assert [(r.agent, r.value) for r in rollout.rewards] == [("ceo", 0.0), ("ceo", 1.0)]


def test_final_message_goes_to_the_terminal_tool(sdk_server):
    url, _ = sdk_server
    env = OrsEnvironment(url, "counter")
    for message, reward in (("done", 1.0), ("nope", 0.0)):
        session = env.session("counter-train-2", 0)
        result, _, events = run_playbook(session, {"ceo": [
            step(call("final_message", text=message))]}, budget=0, config=NO_PLAN)
        end = events_of(events, "end")[0]
        assert end["reason"] == EndReason.FINAL_MESSAGE.value
        assert end["rewards"] == [{"value": reward, "label": "ors"}]


def test_chunks_declared_durations_and_errors(sdk_server):
    url, _ = sdk_server
    env = OrsEnvironment(url, "counter")
    d = Direct(env, "counter-train-2")
    out = d.call("big")
    assert out.text == " ".join(["word"] * 2048)  # 10 KiB: three chunk events, spaces kept
    out = d.call("declared")
    assert (out.duration_s, out.measured) == (42.0, False)
    with pytest.raises(ToolError, match="input_validation"):
        d.call("slow", tag=3)
    with pytest.raises(ToolError, match="not_found"):
        d.call("nosuch")
    with pytest.raises(ToolError, match="boom went the tool"):  # event: error
        d.call("boom")
    d.end()


def test_finished_refuses_later_calls(sdk_server):
    url, _ = sdk_server
    d = Direct(OrsEnvironment(url, "counter"), "counter-train-0")
    d.call("bump")
    assert d.call("bump").terminal
    with pytest.raises(ToolError, match="episode_finished"):
        d.call("bump")
    d.end(EndReason.ENV_TERMINAL)


def test_a_retried_call_does_not_run_twice(sdk_server):
    url, log = sdk_server
    proxy = FlakyProxy(url)
    try:
        env = OrsEnvironment(proxy.url, "counter", backoff_s=0.05)
        d = Direct(env, "counter-train-2")
        proxy.cut = 1  # the stream drops after its task_id: resumed by task_id
        out = d.call("slow", tag="cut-once")
        assert out.text == "slow cut-once done" and out.rewards[0].value == 0.25
        assert proxy.cut == 0 and proxy.calls_seen == 2  # it was cut, then resumed
        proxy.refuse = 2  # 503 twice before the server sees the call: retried
        out = d.call("slow", tag="refused-twice")
        assert out.text == "slow refused-twice done"
        assert proxy.calls_seen == 5
        d.end()
    finally:
        proxy.close()
    assert [r for r in runs(log, "slow") if r[0] in ("cut-once", "refused-twice")] == [
        ["cut-once"], ["refused-twice"]]  # each ran once


def test_a_dead_server_is_a_clear_error(sdk_server):
    url, _ = sdk_server
    proxy = FlakyProxy(url)
    env = OrsEnvironment(proxy.url, "counter", backoff_s=0.01, retries=2)
    d = Direct(env, "counter-train-2")
    proxy.refuse = 10
    with pytest.raises(EnvServerError, match=r"/counter/call \(environment 'counter', tool "
                                             r"'slow'\).*status 503.*after 3 tries"):
        d.call("slow", tag="never")
    d.session.close()
    proxy.close()


def test_parallel_agents_calls_to_one_tool_are_serialised(sdk_server):
    url, log = sdk_server
    env = OrsEnvironment(url, "counter")
    d = Direct(env, "counter-heldout-1")  # target 3: no finish before 2 x 1 calls... see below
    n_before = len(runs(log, "bump"))
    outs, errors = [], []

    def agent(name):
        try:
            outs.append(d.call("bump", agent=name).text)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=agent, args=(f"a{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(outs) == ["count 1", "count 2"]  # no lost update: one at a time
    spans = sorted((float(a), float(b)) for a, b, _ in runs(log, "bump")[n_before:])
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # the runs did not overlap
    d.end()
