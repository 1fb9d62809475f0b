"""The ORS server orders a session's concurrent calls as the `openreward` SDK does
(`@tool(concurrent=, exclusive=)`, `@terminal`): the same schedule of calls is played against
the SDK's own server (`ors_gates_env.py`, a subprocess) and against `OrsServer` serving the
same tools as `ToolSpec(concurrent=, exclusive=)`, and the two must agree on which calls ran
alongside which, which waited for which, and which were refused as `episode_finished`.

The schedule (every tool sleeps `nap` seconds and logs its span):
  t=0.0  a1 (plain), b1 (plain), c1, c2 (concurrent)       -> all four overlap
  t=0.3  a2 (plain: waits for a1), x1 (exclusive: waits for every call in flight)
  t=0.6  c3 (concurrent, but x1 is waiting: the gate prefers the writer)
then   fin1 (finishes after 0.5 s) and c4 (concurrent, 1.2 s): c4's result is discarded,
then   a3: refused, the episode has finished.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("openreward")

from avalon.envs.ors_server import OrsServer  # noqa: E402
from avalon.org.env import FinalOutcome, Param, ParamType, Task, ToolOutcome, ToolSpec  # noqa: E402
from tests.envs.test_ors_client import ROOT, free_port, wait_healthy  # noqa: E402

NAP = 1.0
PHASE1 = [(0.0, "a", "a1"), (0.0, "b", "b1"), (0.0, "c", "c1"), (0.0, "c", "c2"),
          (0.3, "a", "a2"), (0.3, "x", "x1"), (0.6, "c", "c3")]
PHASE2 = [(0.0, "fin", "fin1", 0.5), (0.0, "c", "c4", 1.2), (1.5, "a", "a3", 0.1)]


def _sse_result(raw: bytes) -> dict:
    """The JSON of a call's SSE reply (its `chunk`s and `end`), or {"error": ...}."""
    events, data = [], []
    kind = None
    for line in raw.decode("utf-8").split("\n"):
        line = line.rstrip("\r")
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and kind is not None:
            events.append((kind, "\n".join(data)))
            kind, data = None, []
    text = "".join(d for k, d in events if k in ("chunk", "end"))
    errors = [d for k, d in events if k == "error"]
    return {"error": errors[0]} if errors else json.loads(text)


def _post(url: str, path: str, body: dict, sid: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"X-Session-ID: {sid}\r\nContent-Length: {len(data)}\r\n"
                  "Connection: close\r\n\r\n".encode() + data)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body_bytes = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"chunked" in head.lower():  # the SDK's server streams with chunked encoding
        out, rest = b"", body_bytes
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body_bytes = out
    return status, body_bytes


def play(url: str, env: str, spans) -> tuple[dict, dict]:
    """Plays the module's schedule on one new session; returns ({call: result kind},
    {call: (start, end)}) with the spans read by `spans()` after the calls."""
    sid = str(uuid.uuid4())
    status, body = _post(url, "/create", {"env_name": env, "split": "train", "index": 0}, sid)
    assert status == 200, body
    results: dict[str, str] = {}

    def call(tool: str, tag: str, nap: float) -> None:
        status, raw = _post(url, f"/{env}/call", {"name": tool,
                                                  "input": {"tag": tag, "nap": nap}}, sid)
        out = _sse_result(raw) if status == 200 else {"error": status}
        results[tag] = ("ok" if out.get("ok") else out.get("reason") or str(out))

    def run(schedule) -> None:
        start, threads = time.monotonic(), []
        for at, tool, tag, *nap in schedule:
            time.sleep(max(0.0, start + at - time.monotonic()))
            t = threading.Thread(target=call, args=(tool, tag, nap[0] if nap else NAP))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(60)

    run(PHASE1)
    run(PHASE2)
    _post(url, "/delete", {}, sid)
    return results, spans()


def relations(spans: dict) -> dict[tuple[str, str], str]:
    """For each pair of logged calls: 'overlap', 'before' or 'after' (0.1 s of slack)."""
    out = {}
    names = sorted(spans)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            (s1, e1), (s2, e2) = spans[p], spans[q]
            if e1 <= s2 + 0.1:
                out[(p, q)] = "before"
            elif e2 <= s1 + 0.1:
                out[(p, q)] = "after"
            else:
                out[(p, q)] = "overlap"
    return out


class _GatesSession:
    def __init__(self, log: list):
        self.log = log

    task = Task("gates-train-0", "nap", tuple(
        ToolSpec(name, "nap", (Param("tag", ParamType.STRING), Param("nap", ParamType.NUMBER)),
                 concurrent=name == "c", exclusive=name == "x")
        for name in ("a", "b", "c", "x", "fin")), 1e6)

    def on_start(self, budget, workspace):
        pass

    def brief(self, agent, index, title, role):
        return ""

    def call(self, tool, args, ctx):
        start = time.time()
        time.sleep(args["nap"])
        self.log.append((tool, args["tag"], start, time.time()))
        return ToolOutcome(f"{tool} {args['tag']}", terminal=tool == "fin")

    def on_end(self, ctx):
        return FinalOutcome()


class GatesEnv:
    """The SDK environment's tools as Avalon `ToolSpec`s (thread-safe sessions, like the
    SDK's, so the server adds no lock of its own)."""

    name = "gates"
    uses_workspace = False
    concurrent_sessions = True

    def __init__(self):
        self.log: list = []

    def task_ids(self, split):
        return ("gates-train-0",)

    def task(self, task_id, clock_s=None):
        return _GatesSession.task

    def session(self, task_id, seed, clock_s=None):
        return _GatesSession(self.log)

    def vocabulary(self):
        return ()


def _spans(lines) -> dict:
    return {tag: (float(s), float(e)) for _, tag, s, e in lines}


@pytest.fixture(scope="module")
def sdk_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("gates") / "log"
    log.touch()
    port = free_port()
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tests.security.ors_gates_env", str(port),
                             str(log)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield play(url, "gates", lambda: _spans(ln.split() for ln in log.read_text()
                                                .splitlines()))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_schedule_shows_the_sdk_semantics(sdk_run):
    """The SDK itself does what the module docstring says (so the comparison means it)."""
    results, spans = sdk_run
    rel = relations(spans)
    assert rel[("a1", "b1")] == rel[("c1", "c2")] == rel[("a1", "c1")] == "overlap"
    assert rel[("a1", "a2")] == "before"
    assert all(rel[(p, "x1")] == "before" for p in ("a1", "b1", "c1", "c2"))
    assert rel[("a2", "x1")] == "after" and rel[("c3", "x1")] == "after"
    assert results["c4"] == "episode_finished" and results["a3"] == "episode_finished"
    assert results["fin1"] == "ok"


def test_ors_server_orders_calls_as_the_sdk(sdk_run):
    sdk_results, sdk_spans = sdk_run
    env = GatesEnv()
    with OrsServer([env]) as server:
        results, spans = play(server.url, "gates",
                              lambda: _spans(env.log))
    assert results == sdk_results
    assert relations(spans) == relations(sdk_spans)
