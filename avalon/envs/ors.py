"""`OrsEnvironment`: an `Environment` backed by any Open Reward Standard (ORS 0.1) server, e.g.
one written with the `openreward` SDK (`Server([MyEnv]).run(host="127.0.0.1", port=8080)`) or
Avalon's own (`python -m avalon.envs.serve`). Stdlib only: the client needs no SDK.

Against Avalon's own server the client speaks the Avalon extension (docs/ors_extension.md),
found by `GET /{env}/avalon` (a 404, as from the SDK's servers: plain ORS, described below):
the environment's own task ids, tasks and vocabulary; `on_start` sends the budget, `brief`
asks for each agent's brief, each call carries the caller's context, and `on_end` sends the
end's reason, message and latency and returns the whole `FinalOutcome`, the session closing
with it. With `uses_workspace` the rollout's workspace travels as a snapshot with the start,
each call and the end, and files the environment changes come back; what the agents leave in
it never raises past the organisation (a call whose workspace does not fit a snapshot or that
the server cannot mirror is a `ToolError`; the end sends what fits). A `ToolError` on the
server is raised here as `ToolError`, an unknown task as `UnknownTaskError`, a refused value
as `EnvRequestError` (a ValueError), an environment bug as `EnvServerError`.

    env = OrsEnvironment("http://127.0.0.1:8080", "myenv")
    session = env.session(env.task_ids(Split.TRAIN)[0], seed=0)   # an org EnvSession

Plain ORS. Task ids are `<env>-<split>-<index>` with the split `train` or `heldout` (the server's
`heldout_split`: by default the first of `heldout`, `validation`, `test` it lists). A session
is one ORS session: `create_session` -> `create {split, index}` -> the prompt and the task's
tools (JSON schemas -> `ToolSpec`s); every agent of the rollout calls into that one session
(the server serialises calls to one tool, so parallel agents cannot race a grader). Each host
opens its own sessions; none is shared across processes.

A call posts `{name, input}` and reads the SSE reply (`task_id`, `chunk`s, `end`, keepalive
comments), bounded in size (`max_reply_bytes`) and time (`read_timeout_s` between bytes,
`max_call_s` in all):
  * `reward` -> one `EnvReward` on the calling agent (labelled `ors`; an Avalon server's
    labelled rewards from the metadata when they add up to it), `finished` -> `terminal`;
  * `ok: false` (a bad argument, an unknown tool, `episode_finished`) and `event: error` (the
    tool raised) -> `ToolError`: the agent reads the message;
  * the duration is the declared `duration_s` of the metadata when the server gives one, else
    the measured wall time of the call (`measured=True`);
  * retries with jittered exponential backoff on 429/5xx replies (not an Avalon server's 500
    `env_error`: the environment raised, and a retry would run it again) and dropped
    connections. A stream that drops after its `task_id` is resumed by re-POSTing that
    `task_id`, which the server answers by replaying the stored result: a retried call never
    runs twice. A stream that drops after the server accepted the call but before any
    `task_id` is not retried (the tool may have started): `EnvServerError`.
While a session is open a daemon thread pings it (`ping_s`) so the server does not reap it; the
end calls the server's terminal tool with the CEO's final message when it has one and the
episode is not finished (its reward is the final reward), then deletes the session.

Failures of the server (unreachable after the retries, a reply that is not ORS) raise
`EnvServerError` naming the URL, the environment and the tool.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
import urllib.parse
from typing import Any

from avalon.envs import wire
from avalon.envs.base import Split, UnknownTaskError, check_clock, split_of
from avalon.org.env import (
    TOOL_NAME,
    CallContext,
    EndContext,
    EndReason,
    EnvReward,
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

HELDOUT_NAMES = ("heldout", "validation", "test")
_RETRY_STATUS = {429, 500, 502, 503, 504}
EXTENSION, EXTENSION_VERSION = "avalon", 1  # docs/ors_extension.md


class EnvServerError(RuntimeError):
    """The environment server could not answer properly (see the message)."""


class EnvRequestError(ValueError):
    """The server refused a value of the request (the message names it)."""


class _Retryable(Exception):
    """A failure after which a retry is safe (the message says what happened)."""


class OrsClient:
    """JSON and SSE requests to one ORS server, with bounds and retries (module docstring)."""

    def __init__(self, base_url: str, *, read_timeout_s: float = 60.0, max_call_s: float = 3600.0,
                 retries: int = 4, backoff_s: float = 0.25, max_reply_bytes: int = 16 << 20):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OrsEnvironment base_url must start with http:// or https://, "
                             f"got {base_url!r}")
        for name, value in (("read_timeout_s", read_timeout_s), ("max_call_s", max_call_s),
                            ("backoff_s", backoff_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"OrsEnvironment {name} must be a number > 0, got {value!r}")
        for name, value in (("retries", retries), ("max_reply_bytes", max_reply_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"OrsEnvironment {name} must be an int >= 0, got {value!r}")
        self.url = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        self._kind = (http.client.HTTPSConnection if parts.scheme == "https"
                      else http.client.HTTPConnection)
        self._host, self._port, self._base = parts.hostname or "", parts.port, parts.path
        self.read_timeout_s, self.max_call_s = float(read_timeout_s), float(max_call_s)
        self.retries, self.backoff_s, self.max_reply_bytes = retries, backoff_s, max_reply_bytes
        self._local = threading.local()

    def _connection(self, fresh: bool) -> http.client.HTTPConnection:
        if fresh:  # an event stream: its own connection, closed at its end
            return self._kind(self._host, self._port, timeout=self.read_timeout_s)
        conn = self._local.__dict__.get("conn")  # one kept-alive connection per thread
        if conn is None:
            conn = self._local.conn = self._kind(self._host, self._port,
                                                 timeout=self.read_timeout_s)
        return conn

    def _drop_connection(self) -> None:
        conn = self._local.__dict__.pop("conn", None)
        if conn is not None:
            conn.close()

    def _headers(self, sid: str | None, sse: bool) -> dict:
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if sse else "application/json"}
        if sid is not None:
            headers["X-Session-ID"] = sid
        return headers

    def _backoff(self, attempt: int, where: str, error: str, started: float) -> None:
        if attempt > self.retries or time.monotonic() - started > self.max_call_s:
            raise EnvServerError(f"{where}: {error} (after {attempt} tries)")
        time.sleep(min(10.0, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))

    def request(self, method: str, path: str, body: dict | None = None, *,
                sid: str | None = None, where: str = "", missing_ok: bool = False) -> Any:
        """A JSON request (retried on 429/5xx and dropped connections); the decoded reply
        (None for a 404 or 405 when `missing_ok`: a route the server does not have)."""
        where = where or f"{method} {self.url}{path}"
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        if data is None and method == "POST":
            data = b"{}"
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                conn = self._connection(fresh=False)
                conn.request(method, self._base + path, body=data,
                             headers=self._headers(sid, sse=False))
                resp = conn.getresponse()
                raw = resp.read(self.max_reply_bytes + 1)
                if resp.status in _RETRY_STATUS and not _is_bug(resp.status, raw):
                    raise _Retryable(f"status {resp.status}")
            except (http.client.HTTPException, OSError, _Retryable) as e:
                self._drop_connection()
                self._backoff(attempt, where, f"server unreachable or failing ({e})", started)
                continue
            if len(raw) > self.max_reply_bytes:
                self._drop_connection()
                raise EnvServerError(f"{where}: reply over {self.max_reply_bytes} bytes")
            if resp.status in (404, 405) and missing_ok:
                return None
            if resp.status != 200:
                raise _refusal(where, resp.status, raw)
            try:
                return json.loads(raw)
            except (ValueError, RecursionError):
                raise EnvServerError(f"{where}: reply is not JSON: {raw[:80]!r}") from None

    def stream(self, path: str, body: dict, *, sid: str | None, where: str,
               errors_are_bugs: bool = False) -> tuple[Any, str | None]:
        """An SSE request: the decoded JSON of its `end` event (None for an empty one) and its
        task_id. Raises `ToolError` for `event: error` (`EnvServerError` with
        `errors_are_bugs`: an Avalon server sends it only when the environment raised
        something other than ToolError); resumes a dropped stream by its task_id."""
        task_id: str | None = None
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            payload = dict(body) if task_id is None else {**body, "task_id": task_id}
            accepted = False
            conn = self._connection(fresh=True)
            try:
                conn.request("POST", self._base + path,
                             body=json.dumps(payload, allow_nan=False).encode(),
                             headers=self._headers(sid, sse=True))
                resp = conn.getresponse()
                if resp.status in _RETRY_STATUS:
                    raise _Retryable(f"status {resp.status}")
                if resp.status != 200:
                    raise _refusal(where, resp.status, resp.read(4096))
                accepted = True
                text = []
                size = 0
                for event, data in self._events(resp, started, where):
                    if event == "task_id":
                        task_id = data.strip()
                    elif event in ("chunk", "end"):
                        size += len(data)
                        if size > self.max_reply_bytes:
                            raise EnvServerError(f"{where}: reply over {self.max_reply_bytes} "
                                                 f"bytes")
                        text.append(data)
                        if event == "end":
                            return _loads("".join(text), where), task_id
                    elif event == "error":
                        if errors_are_bugs:
                            raise EnvServerError(f"{where}: the environment failed: {data}")
                        raise ToolError(f"the environment failed: {data}")
                raise _Retryable("the stream ended before its end event")
            except (http.client.HTTPException, OSError, _Retryable) as e:
                if accepted and task_id is None:
                    raise EnvServerError(f"{where}: the stream dropped before its task_id "
                                         f"({e}); not retried, the call may have run") from None
                self._backoff(attempt, where, f"server unreachable or failing ({e})", started)
            finally:
                conn.close()

    def _events(self, resp, started: float, where: str):
        """(event, data) pairs of an SSE stream; comments (keepalives) are skipped."""
        event, data = None, []
        while True:
            if time.monotonic() - started > self.max_call_s:
                raise EnvServerError(f"{where}: no result within {self.max_call_s:g} s")
            raw = resp.readline(1 << 16)
            if not raw:
                return
            if not raw.endswith(b"\n"):
                if len(raw) >= 1 << 16:
                    raise EnvServerError(f"{where}: an event line over 64 KiB")
                return  # cut mid-line: the stream dropped
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line:
                if event is not None:
                    yield event, "\n".join(data)
                event, data = None, []
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value  # one space, per the spec
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)


def _decoded(decode, where: str):
    """`decode()`, a reply's malformed field as `EnvServerError` naming it."""
    try:
        return decode()
    except wire.WireError as e:
        raise EnvServerError(f"{where}: bad reply: {e}") from None


def _is_bug(status: int, raw: bytes) -> bool:
    """An Avalon server's 500 `env_error`: the environment raised. Not retried: sending the
    request again would run it again (an `on_start`, an `on_end`)."""
    if status != 500 or b'"env_error"' not in raw[:4096]:
        return False
    try:
        return json.loads(raw).get("kind") == "env_error"
    except (ValueError, RecursionError, AttributeError):
        return False


def _refusal(where: str, status: int, raw: bytes) -> Exception:
    """The error a non-200 reply raises. Avalon's servers say what kind of refusal it is
    (`{"error", "kind"}`): an unknown task is `UnknownTaskError`, a refused value (400
    `bad_request`) `EnvRequestError`; anything else is `EnvServerError`."""
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        reply = None
    if isinstance(reply, dict) and isinstance(reply.get("kind"), str) \
            and isinstance(reply.get("error"), str):
        kind, message = reply["kind"], reply["error"]
        if kind == "unknown_task":
            return UnknownTaskError(message)
        if kind == "bad_request" and status == 400:
            return EnvRequestError(f"{where}: {message}")
        return EnvServerError(f"{where}: status {status} {kind}: {message}")
    shown = raw[:200].decode("utf-8", errors="replace")
    return EnvServerError(f"{where}: status {status}: {shown}")


def _loads(text: str, where: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise EnvServerError(f"{where}: result is not JSON: {text[:80]!r}") from None


def tool_from_ors(obj: Any, where: str) -> ToolSpec:
    """An ORS tool spec `{name, description, input_schema}` as a ToolSpec (a ValueError names
    the tool and the parameter the simulator cannot represent)."""
    name = wire.field(obj, "name", str, where)
    where = f"{where}: tool {name!r}"
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"{where}: the name must match {TOOL_NAME.pattern} for the simulator")
    schema = obj.get("input_schema") or {}
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: input_schema is {type(schema).__name__}, not an object")
    props = schema.get("properties") or {}
    required = schema.get("required") or []
    params = []
    for pname, prop in props.items():
        kind = _param_type(prop)
        if kind is None:
            raise ValueError(f"{where}: parameter {pname!r} has a JSON schema the simulator "
                             f"cannot check ({json.dumps(prop)[:120]}); it needs one of "
                             f"{[t.value for t in ParamType]}")
        desc = prop.get("description") or prop.get("title") or ""
        params.append(Param(pname, kind, desc if isinstance(desc, str) else "",
                            required=pname in required))
    description = obj.get("description") or ""
    return ToolSpec(name, description if isinstance(description, str) else "", tuple(params))


def _param_type(prop: Any) -> ParamType | None:
    if not isinstance(prop, dict):
        return None
    kind = prop.get("type")
    if kind is None and isinstance(prop.get("anyOf"), list):  # Optional[X] in pydantic
        kinds = [p.get("type") for p in prop["anyOf"] if isinstance(p, dict)]
        kinds = [k for k in kinds if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    try:
        return ParamType(kind)
    except ValueError:
        return None


class OrsEnvironment:
    """An Environment over an ORS server (see the module docstring).

    Plain ORS: `wall_clock_s` and `objective` describe the tasks (ORS has no clock and no
    objective); `seed` is ignored (an ORS session's randomness is the server's). With the
    Avalon extension (`extension`: None uses it when the server offers it, True requires it,
    False never uses it) the server's own tasks, ids, seeds, clocks and objectives are used.
    """

    def __init__(self, base_url: str, env_name: str, *, wall_clock_s: float = 3600.0,
                 objective: Objective = Objective.SUM, heldout_split: str | None = None,
                 ping_s: float = 30.0, read_timeout_s: float = 60.0, max_call_s: float = 3600.0,
                 retries: int = 4, backoff_s: float = 0.25, max_reply_bytes: int = 16 << 20,
                 extension: bool | None = None):
        self._client = OrsClient(base_url, read_timeout_s=read_timeout_s, max_call_s=max_call_s,
                                 retries=retries, backoff_s=backoff_s,
                                 max_reply_bytes=max_reply_bytes)
        if not isinstance(env_name, str) or not env_name:
            raise ValueError(f"OrsEnvironment env_name must be a non-empty string, got "
                             f"{env_name!r}")
        self._name = env_name
        self.wall_clock_s = check_clock(wall_clock_s, 1.0, "OrsEnvironment wall_clock_s")
        self.objective = Objective(objective)
        if isinstance(ping_s, bool) or not isinstance(ping_s, (int, float)) or not ping_s > 0:
            raise ValueError(f"OrsEnvironment ping_s must be a number > 0, got {ping_s!r}")
        self.ping_s = float(ping_s)
        listed = self._client.request("GET", "/list_environments")
        if not isinstance(listed, list) or env_name.lower() not in [str(n).lower()
                                                                    for n in listed]:
            raise ValueError(f"ORS server {self.url} has no environment {env_name!r} "
                             f"(it serves {listed!r})")
        splits = self._request("GET", "/splits")
        names = [s.get("name") if isinstance(s, dict) else s for s in splits] \
            if isinstance(splits, list) else []
        if "train" not in names:
            raise ValueError(f"ORS server {self.url} environment {env_name!r} has no 'train' "
                             f"split (it has {names})")
        if heldout_split is None:
            heldout_split = next((n for n in HELDOUT_NAMES if n in names), None)
        elif heldout_split not in names:
            raise ValueError(f"ORS server {self.url} environment {env_name!r} has no split "
                             f"{heldout_split!r} (it has {names})")
        self.splits = {Split.TRAIN: "train", Split.HELDOUT: heldout_split}
        self._counts: dict[Split, int] = {}
        self._ids: dict[Split, tuple[str, ...]] = {}
        self.extension = None if extension is False else self._probe(extension is True)

    def _probe(self, required: bool) -> dict | None:
        """The server's `GET /{env}/avalon` (docs/ors_extension.md), checked; None when the
        server does not offer it (a 404, as the SDK's servers answer)."""
        where = f"GET {self.url}/{self._name}/{EXTENSION}"
        info = self._client.request("GET", f"/{self._name}/{EXTENSION}", where=where,
                                    missing_ok=True)
        if info is None:
            if required:
                raise ValueError(f"ORS server {self.url} environment {self._name!r} does not "
                                 f"offer the {EXTENSION} extension")
            return None
        try:
            if wire.field(info, "extension", str, "extension info") != EXTENSION:
                raise wire.WireError(f"extension info: extension is {info['extension']!r}")
            version = wire.field(info, "version", int, "extension info")
            if version != EXTENSION_VERSION:
                raise wire.WireError(f"extension info: version {version} (this client speaks "
                                     f"{EXTENSION_VERSION})")
            vocabulary = wire.field(info, "vocabulary", list, "extension info")
            return {"name": wire.field(info, "name", str, "extension info"),
                    "uses_workspace": wire.field(info, "uses_workspace", bool, "extension info"),
                    "vocabulary": tuple(str(w) for w in vocabulary)}
        except wire.WireError as e:
            raise EnvServerError(f"{where}: bad reply: {e}") from None

    @property
    def name(self) -> str:
        return self.extension["name"] if self.extension else self._name

    @property
    def url(self) -> str:
        return self._client.url

    @property
    def uses_workspace(self) -> bool:
        """Plain ORS: False (an ORS environment's files live on its server). Extended: the
        environment's own; the rollout's workspace then travels with each request."""
        return bool(self.extension and self.extension["uses_workspace"])

    def _request(self, method: str, route: str, body: dict | None = None,
                 sid: str | None = None, tool: str = "") -> Any:
        path = f"/{self._name}{route}"
        where = f"{method} {self.url}{path} (environment {self._name!r}" + (
            f", tool {tool!r})" if tool else ")")
        return self._client.request(method, path, body, sid=sid, where=where)

    def task_ids(self, split: Split) -> tuple[str, ...]:
        split = Split(split)
        if self.splits[split] is None:
            return ()
        if self.extension:  # the environment's own ids, from the task specs it lists
            if split not in self._ids:
                self._ids[split] = self._listed_ids(self.splits[split])
            return self._ids[split]
        if split not in self._counts:
            reply = self._request("POST", "/num_tasks", {"split": self.splits[split]})
            n = reply.get("num_tasks") if isinstance(reply, dict) else None
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise EnvServerError(f"{self.url} environment {self._name!r}: num_tasks reply "
                                     f"{reply!r} is not a count")
            self._counts[split] = n
        return tuple(f"{self._name}-{split.value}-{i}" for i in range(self._counts[split]))

    def _listed_ids(self, split: str) -> tuple[str, ...]:
        reply = self._request("POST", "/tasks", {"split": split})
        tasks = reply.get("tasks") if isinstance(reply, dict) else None
        try:
            if not isinstance(tasks, list):
                raise wire.WireError(f"tasks reply {str(reply)[:120]} has no 'tasks' list")
            return tuple(wire.field(t, "task_id", str, "task spec") for t in tasks)
        except wire.WireError as e:
            raise EnvServerError(f"{self.url} environment {self._name!r}: {e}") from None

    def _locate(self, task_id: str) -> tuple[str, int]:
        if not isinstance(task_id, str):
            raise UnknownTaskError(f"{self._name}: task id must be a string, got {task_id!r}")
        split = split_of(task_id)
        if task_id not in self.task_ids(split):
            raise UnknownTaskError(f"environment {self._name!r} at {self.url} has no task "
                                   f"{task_id!r}")
        return self.splits[split], int(task_id.rpartition("-")[2])

    def task(self, task_id: str, clock_s: float | None = None) -> Task:
        """The task, read from a session opened and deleted for it (ORS serves prompts and
        task tools per session); extended, from `avalon/task`."""
        if self.extension:
            if clock_s is not None:
                check_clock(clock_s, 1.0, f"task {task_id!r}")  # what JSON cannot carry
            reply = self._request("POST", f"/{EXTENSION}/task",
                                  {"task_id": task_id, "clock_s": clock_s})
            return _decoded(lambda: wire.task_from_json(wire.field(reply, "task", dict,
                                                                   "task reply")),
                            f"{self.url} environment {self._name!r}")
        session = self.session(task_id, 0, clock_s)
        session.close()
        return session.task

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> OrsSession:
        if self.extension:
            if clock_s is not None:
                check_clock(clock_s, 1.0, f"task {task_id!r}")
            return OrsSession(self, task_id, None, 0, clock_s, seed=seed)
        split, index = self._locate(task_id)
        clock = check_clock(clock_s, self.wall_clock_s, f"task {task_id!r}")
        return OrsSession(self, task_id, split, index, clock)

    def vocabulary(self) -> tuple[str, ...]:
        """Words of the environment-level tool list (prompts need a session; a byte or HF
        tokenizer is the usual choice for ORS environments); extended, the environment's own
        vocabulary."""
        if self.extension:
            return self.extension["vocabulary"]
        reply = self._request("GET", "/tools")
        words: list[str] = []
        for t in reply.get("tools", []) if isinstance(reply, dict) else []:
            text = json.dumps(t)
            words += [w for w in _words(text) if len(w) >= 2]
        return tuple(dict.fromkeys(words))


def _words(text: str) -> list[str]:
    out, cur = [], []
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            cur.append(ch)
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


class OrsSession:
    """One rollout's ORS session, an org `EnvSession` (see the module docstring)."""

    def __init__(self, env: OrsEnvironment, task_id: str, split: str | None, index: int,
                 clock_s: float | None, *, seed: int = 0):
        self._env, self._client = env, env._client
        self._extended = env.extension is not None  # then `split` and `index` are unused
        where = f"POST {self._client.url}/create_session (environment {env._name!r})"
        self.sid = self._open_sid(where)
        self._finished = False
        self._closed = False
        self.terminal_tool: tuple[str, str | None] | None = None
        self._stop = threading.Event()
        where = f"POST {self._client.url}/create (environment {env._name!r}, task {task_id!r})"
        try:
            if self._extended:
                spec = {"task_id": task_id, "seed": seed, "clock_s": clock_s}
                reply = self._client.request("POST", "/create", {
                    "env_name": env._name, "task_spec": spec, EXTENSION: EXTENSION_VERSION},
                    sid=self.sid, where=where)
                self._task = _decoded(lambda: wire.task_from_json(wire.field(
                    wire.field(reply, EXTENSION, dict, "create reply"), "task", dict,
                    "create reply")), where)
            else:
                self._client.request("POST", "/create", {"env_name": env._name, "split": split,
                                                         "index": index}, sid=self.sid,
                                     where=where)
                prompt = env._request("GET", "/prompt", sid=self.sid)
                tools = env._request("GET", "/task_tools", sid=self.sid)
                self._task = self._build_task(task_id, prompt, tools, clock_s)
        except BaseException:
            self._delete()
            raise
        self._pinger = threading.Thread(target=self._ping_loop, daemon=True,
                                        name=f"ors-ping-{self.sid[:8]}")
        self._pinger.start()

    def _open_sid(self, where: str) -> str:
        """The SDK answers `event: task_id` with the id and an empty end; the spec pages give
        `{"sid"}` in the end's data: either is accepted."""
        reply, task_id = self._client.stream("/create_session", {}, sid=None, where=where)
        if isinstance(reply, dict) and isinstance(reply.get("sid"), str):
            return reply["sid"]
        if not task_id:
            raise EnvServerError(f"{where}: no session id in the reply")
        return task_id

    def _build_task(self, task_id: str, prompt: Any, tools: Any, clock_s: float) -> Task:
        where = f"{self._env.url} environment {self._env.name!r}"
        if not isinstance(prompt, list):
            raise EnvServerError(f"{where}: prompt is {type(prompt).__name__}, not blocks")
        if not isinstance(tools, dict) or not isinstance(tools.get("tools"), list):
            raise EnvServerError(f"{where}: task_tools reply has no 'tools' list")
        specs = tuple(tool_from_ors(t, where) for t in tools["tools"])
        terminal = tools.get("terminal_tool")
        if isinstance(terminal, dict) and isinstance(terminal.get("name"), str):
            arg = terminal.get("arg")
            self.terminal_tool = (terminal["name"], arg if isinstance(arg, str) else None)
        return Task(task_id=task_id, prompt=blocks_text(prompt), tools=specs,
                    wall_clock_s=clock_s, objective=self._env.objective)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        """Plain ORS: nothing (no hire budget; the files live on the server). Extended: the
        budget and the workspace go to `avalon/start`; files the environment lays out come
        back."""
        if not self._extended:
            return
        body: dict = {"budget": budget}
        if self._env.uses_workspace:
            body["workspace"], _ = wire.snapshot(workspace)  # fresh: the environment's alone
        reply = self._extension("start", body)
        try:
            self._write_back(reply, workspace)
        except wire.WireError as e:
            raise EnvServerError(f"{self._where('start')}: bad reply: {e}") from None

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        """Plain ORS: none (the server put the CEO's brief in the prompt). Extended: each
        agent's private brief from `avalon/brief`."""
        if not self._extended:
            return ""
        reply = self._extension("brief", {"agent": agent, "index": index, "title": title,
                                          "role": role})
        return _decoded(lambda: wire.field(reply, "text", str, "brief reply"),
                        self._where("brief"))

    def _where(self, op: str) -> str:
        return (f"POST {self._client.url}/{self._env._name}/{EXTENSION}/{op} (environment "
                f"{self._env._name!r})")

    def _extension(self, op: str, body: dict) -> Any:
        return self._client.request("POST", f"/{self._env._name}/{EXTENSION}/{op}", body,
                                    sid=self.sid, where=self._where(op))

    def _write_back(self, reply: Any, workspace: Workspace) -> None:
        """Writes a reply's workspace (the environment changed files) into the rollout's."""
        if self._env.uses_workspace and isinstance(reply, dict) and "workspace" in reply:
            wire.restore(workspace, reply["workspace"])

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if self._extended:
            return self._extended_call(tool, args, ctx)
        t0 = time.monotonic()
        result = self._call(tool, args)
        wall = time.monotonic() - t0
        return self._outcome(tool, result, wall)

    def _extended_call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        """The caller's context and workspace go with the call; the environment's own outcome
        (or ToolError) and changed files come back in `metadata.avalon`."""
        extended: dict = {"ctx": wire.call_ctx_to_json(ctx)}
        if self._env.uses_workspace:
            snap, left_out = wire.snapshot(ctx.workspace)
            if left_out:
                raise ToolError(f"the workspace cannot be sent to the environment: "
                                f"{left_out[0]}" + (f" (and {len(left_out) - 1} more)"
                                                    if len(left_out) > 1 else ""))
            extended["workspace"] = snap
        output = self._call(tool, args, extended)
        where = (f"{self._client.url} environment {self._env._name!r} tool {tool!r}")
        meta = output.get("metadata")
        reply = meta.get(EXTENSION) if isinstance(meta, dict) else None
        if not isinstance(reply, dict):
            raise EnvServerError(f"{where}: result has no metadata.{EXTENSION} object")
        try:  # the server's files could not be written back: the agents' files are in the way
            self._write_back(reply, ctx.workspace)
        except wire.WireError as e:
            raise ToolError(f"the environment's files could not be written back: {e}") from None
        if "tool_error" in reply:
            message = reply["tool_error"]
            raise ToolError(message if isinstance(message, str) else repr(message))
        return _decoded(lambda: wire.outcome_from_json(wire.field(reply, "outcome", dict,
                                                                  "result")), where)

    def _call(self, tool: str, args: dict, extended: dict | None = None) -> dict:
        path = f"/{self._env._name}/call"
        where = (f"POST {self._client.url}{path} (environment {self._env._name!r}, "
                 f"tool {tool!r})")
        body = {"name": tool, "input": args}
        if extended is not None:
            body[EXTENSION] = extended
        result, _ = self._client.stream(path, body, sid=self.sid, where=where,
                                        errors_are_bugs=extended is not None)
        if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
            raise EnvServerError(f"{where}: result {str(result)[:120]} is not an ORS tool "
                                 f"result")
        if not result["ok"]:
            reason = result.get("reason") or "error"
            raise ToolError(f"{tool}: {reason}: {result.get('error', '(no message)')}")
        output = result.get("output")
        if not isinstance(output, dict):
            raise EnvServerError(f"{where}: result has no output object")
        return output

    def _outcome(self, tool: str, output: dict, wall_s: float) -> ToolOutcome:
        where = f"{self._client.url} environment {self._env.name!r} tool {tool!r}"
        reward = output.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(
                reward, (int, float)) or not math.isfinite(reward)):
            raise EnvServerError(f"{where}: reward {reward!r} is not a finite number")
        finished = output.get("finished", False)
        if not isinstance(finished, bool):
            raise EnvServerError(f"{where}: finished {finished!r} is not a boolean")
        meta = output.get("metadata") or {}
        meta = meta if isinstance(meta, dict) else {}
        rewards = _rewards(reward, meta.get("rewards"))
        declared = meta.get("duration_s")
        if (meta.get("measured") is not True and isinstance(declared, (int, float))
                and not isinstance(declared, bool) and math.isfinite(declared)
                and declared >= 0):
            duration, measured = float(declared), False
        else:
            duration, measured = wall_s, True
        if finished:
            self._finished = True
        return ToolOutcome(text=blocks_text(output.get("blocks")), rewards=rewards,
                           terminal=finished, duration_s=duration, measured=measured,
                           error=meta.get("error") is True)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        if self._extended:
            return self._extended_end(ctx)
        try:
            rewards: tuple[EnvReward, ...] = ()
            if (self.terminal_tool is not None and not self._finished
                    and ctx.reason is EndReason.FINAL_MESSAGE):
                name, arg = self.terminal_tool
                args = {} if arg is None else {arg: ctx.final_message or ""}
                try:
                    rewards = self._outcome(name, self._call(name, args), 0.0).rewards
                except ToolError:
                    rewards = ()  # the episode had already ended on the server
            return FinalOutcome(rewards=rewards)
        finally:
            self.close()

    def _extended_end(self, ctx: EndContext) -> FinalOutcome:
        """`avalon/end`: the end's reason, final message and latency and the workspace (what
        fits a snapshot: every episode is graded) go; the final outcome comes back, and the
        server closes the session."""
        body: dict = {"ctx": wire.end_ctx_to_json(ctx)}
        if self._env.uses_workspace:
            body["workspace"], _ = wire.snapshot(ctx.workspace)
        try:
            reply = self._extension("end", body)
        except BaseException:
            self.close()
            raise
        self._closed = True  # the server dropped it
        self._stop.set()
        return _decoded(lambda: wire.final_from_json(wire.field(reply, "final", dict,
                                                                "end reply")), self._where("end"))

    def _ping_loop(self) -> None:
        while not self._stop.wait(self._env.ping_s):
            try:
                self._client.request("POST", "/ping", {}, sid=self.sid)
            except EnvServerError:
                pass  # the next call reports a dead server; a missed ping is not fatal

    def close(self) -> None:
        """Stops the pings and deletes the session on the server (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._delete()

    def _delete(self) -> None:
        try:
            self._client.request("POST", "/delete", {}, sid=self.sid)
        except EnvServerError:
            pass  # the server reaps it after its TTL


def _rewards(reward: float | None, labelled: Any) -> tuple[EnvReward, ...]:
    """The call's reward; an Avalon server's labelled rewards when they add up to it."""
    if reward is None:
        return ()
    if isinstance(labelled, list) and labelled:
        try:
            parts = wire.rewards_from_json(labelled, "metadata rewards")
        except (wire.WireError, TypeError, ValueError):
            parts = ()
        if parts and math.isclose(sum(r.value for r in parts), reward, abs_tol=1e-9):
            return parts
    return (EnvReward(float(reward), "ors"),)


def blocks_text(blocks: Any) -> str:
    """ORS content blocks as the text an agent reads (an image as a placeholder)."""
    if not isinstance(blocks, list):
        return ""
    out = []
    for b in blocks:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "image":
            out.append(f"[image {b.get('mimeType', '')}]")
        elif isinstance(b.get("text"), str):
            out.append(b["text"])
    return "\n".join(out)
