"""Serves Avalon environments over the Open Reward Standard (ORS 0.1, as the `openreward` SDK
serves it), so any ORS client (the SDK's own, other trainers' adapters) can list, open and play
them. Stdlib only, on the hardened transport (`avalon/envs/transport.py`).

    with OrsServer([ParallelSubtasks()]) as server:        # 127.0.0.1, an ephemeral port
        env = OrsEnvironment(server.url, "parallel")       # or the SDK's client
    python -m avalon.envs.serve --env=MODULE:FACTORY       # the command line

Routes (`{env}` is an environment's name, lower case; a bare route is the first environment's):
  GET  /health, /list_environments, /{env}/splits, /{env}/tools
  POST /{env}/tasks {split}, /{env}/num_tasks {split}, /{env}/task {split, index}
  POST /create_session                  -> SSE: task_id <sid>, end
  POST /create  {env_name?, task_spec | split+index}   (header X-Session-ID; the session opens)
  GET  /{env}/prompt, /{env}/task_tools; POST /ping, /delete      (header X-Session-ID)
  POST /{env}/call {name, input, task_id?} -> SSE: task_id, [chunk...], end (or event: error)
Splits are `train` and `heldout` (type `test`); a task spec is `{"task_id"}`, with optional
`seed`, `budget` (hires; default the server's) and `clock_s`.
The Avalon extension (docs/ors_extension.md; `GET /{env}/avalon` advertises it) adds
`POST /{env}/avalon/{task,start,brief,end}` and an `avalon` field on `/create` and `/{env}/call`:
an extended session is the in-process `EnvSession` over the wire (the organisation's budget,
every agent's brief, the caller and its clock, its own end with the final outcome, and the
rollout's workspace mirrored into the session's directory). Plain ORS clients never see it.

How an `EnvSession` maps onto plain ORS (one agent, the CEO, plays an ORS session):
  * the prompt is the task's prompt, then the CEO's private brief when the environment deals
    one; `on_start` runs at /create with the session's budget and a server-side workspace
    (files stay on the server, as they do in ORS environments);
  * a call's result is `{blocks: [text], reward, finished, metadata}`: `reward` the sum of the
    call's rewards (null when none), `finished` the outcome's `terminal`, and `metadata` keeps
    what ORS has no field for: the labelled `rewards`, the declared `duration_s` (or the
    measured wall time with `measured: true`) and `error`; a ToolError is such a result with
    `error: true` (the agent's mistake, not the server's), an exception in the environment is
    `event: error` (a bug);
  * the organisation's `final_message` is the ORS terminal tool (`terminal_tool` in the tool
    lists, argument `message`): calling it ends the episode (`on_end`) and its reward is the
    final rewards' sum (`metadata`: labelled rewards, `wealth_ratio`, `metrics`); a terminal
    outcome runs `on_end` too, its final rewards added to that call's reward;
  * calls of one session are ordered as the SDK orders them (`openreward`'s
    `@tool(shared, concurrent, exclusive)` and `@terminal`, as `ToolSpec.concurrent` and
    `ToolSpec.exclusive`): calls to one tool run one at a time (a lock per tool, so different
    tools overlap); a `concurrent` tool skips the tool lock; an `exclusive` tool, and the
    terminal `final_message`, waits for every call in flight and holds new ones until it
    returns (a writer-preferring gate, so a stream of calls cannot starve it). The first
    `finished` wins: a call that ran alongside it has its result discarded, and every later
    call is answered `{ok: false, reason: "episode_finished"}`. An `EnvSession` is
    single-threaded, so unless the environment says `concurrent_sessions = True` the server
    also runs one `call` of a session at a time (the environment's own lock, in SDK terms);
    each call gets a `task_id`, and a re-POST with it replays the stored result (waiting if it
    is still running) without running the tool again;
  * at most `max_sessions` sessions exist, counting those being created (their `on_start` may
    be slow: the slot is taken before it runs); a session not used or pinged for
    `session_ttl_s` (900 s, as the SDK) is reaped;
  * `/delete` ends a session's calls before its directory goes: no call of it starts its tool
    (or writes its workspace mirror) afterwards, each is answered `not_found`; the delete waits
    up to `DELETE_WAIT_S` for the calls already inside the environment, then removes the
    session's directory (or, a call still running, the last call to end removes it).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from avalon.envs import wire
from avalon.envs.base import Environment, Split
from avalon.envs.transport import HttpError, HttpService, ServerLimits, SseReply
from avalon.org.env import (
    CallContext,
    EndContext,
    EndReason,
    EnvSession,
    FinalOutcome,
    Task,
    ToolError,
    ToolSpec,
)
from avalon.org.workspace import Workspace

ORS_LIMITS = ServerLimits(session_ttl_s=900.0)
CHUNK_CHARS = 4096  # an SSE event's data, as the SDK chunks results
PING_S = 10.0  # keepalive comments while a call runs (the SDK client reads with a 30 s timeout)
# Per session: finished calls whose results a retry can still fetch, and calls in flight.
REPLAYS_KEPT = 64
FINAL_TOOL = "final_message"
DELETE_WAIT_S = 30.0  # how long /delete waits for the session's calls already running
SPLITS = {"train": Split.TRAIN, "heldout": Split.HELDOUT}
_SESSION_ROUTES = {"prompt", "task_tools", "call"}
EXTENSION, EXTENSION_VERSION = "avalon", 1  # docs/ors_extension.md
_ENV_ROUTES = {"splits", "tools", "tasks", "num_tasks", "task", EXTENSION} | _SESSION_ROUTES


def tool_json(spec: ToolSpec) -> dict:
    return {"name": spec.name, "description": spec.description,
            "input_schema": spec.json_schema()}


TERMINAL_JSON = {"name": FINAL_TOOL, "arg": "message",
                 "description": "End the episode with your final answer; it is graded."}


@dataclasses.dataclass
class _Job:
    """One call: its result (the `end` JSON text) or error, once done."""

    task_id: str
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: str = ""
    error: str | None = None


class _Gate:
    """Per-session readers-writer gate, writer-preferring (the SDK's `_ExclusiveGate`, with
    threads): every call shares it, an exclusive call owns it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._active = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and self._active == 0)
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


@dataclasses.dataclass
class _Open:
    env: Environment
    session: EnvSession
    task: Task
    prompt: str
    workspace: Workspace
    root: str
    lock: threading.Lock  # the session's state: one `call` at a time unless it is thread-safe
    last_used: float
    jobs: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)
    clock_s: float = 0.0  # the CEO's derived clock: declared durations so far
    extended: bool = False  # opened with the Avalon extension (docs/ors_extension.md)
    finished: bool = False
    closed: bool = False
    gate: _Gate = dataclasses.field(default_factory=_Gate)
    running: int = 0  # calls accepted and not yet returned (the server's lock guards it)
    tool_locks: dict = dataclasses.field(default_factory=dict)  # tool name -> Lock
    latch: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # finished, clock

    def tool_lock(self, name: str) -> threading.Lock:
        with self.latch:
            return self.tool_locks.setdefault(name, threading.Lock())


class OrsServer(HttpService):
    """Avalon environments as an ORS server (see the module docstring)."""

    def __init__(self, envs: Sequence[Environment], host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits = ORS_LIMITS, budget: int = 0):
        if not envs:
            raise ValueError("OrsServer needs at least one environment")
        self.envs: dict[str, Environment] = {}
        for env in envs:
            key = env.name.lower()
            if key in self.envs:
                raise ValueError(f"OrsServer: two environments are named {key!r}")
            self.envs[key] = env
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"OrsServer budget must be an int >= 0, got {budget!r}")
        self.budget = budget
        self._sessions: dict[str, _Open] = {}
        self._creating: set[str] = set()  # sessions whose on_start runs: they hold a slot
        self._env_lock = threading.Lock()  # environment-level calls (task tables are lazy)
        self._next_reap = 0.0
        self.reaped = 0
        super().__init__("ors-" + "-".join(self.envs), host, port, limits)
        self._calls_ended = threading.Condition(self._lock)  # a session's `running` went down

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _closed(self) -> None:
        with self._lock:
            entries, self._sessions = list(self._sessions.values()), {}
            for entry in entries:
                entry.closed = True
            idle = [entry for entry in entries if entry.running == 0]
        for entry in idle:  # a call still running removes its session's when it ends
            shutil.rmtree(entry.root, ignore_errors=True)

    # ----- routes -----

    def handle(self, method, path, query, body, headers):
        parts = [p for p in path.split("/") if p]
        if parts == ["health"] and method == "GET":
            return {"status": "ok"}
        if parts == ["list_environments"] and method == "GET":
            return list(self.envs)
        if parts == ["create_session"] and method == "POST":
            return SseReply(_session_id_stream(str(uuid.uuid4())))
        if len(parts) == 1 and parts[0] in ("create", "ping", "delete") and method == "POST":
            sid = _sid(headers)
            if parts[0] == "create":
                return self._create(sid, body)
            entry = self._entry(sid)
            if parts[0] == "ping":
                entry.last_used = time.monotonic()
                return {"status": "ok"}
            self._drop(sid, entry, wait_s=DELETE_WAIT_S)
            return {"sid": sid}
        if (len(parts) == 3 and parts[0].lower() in self.envs and parts[1] == EXTENSION
                and method == "POST"):
            return self._extension(self.envs[parts[0].lower()], parts[2], body, headers)
        if len(parts) == 1 and parts[0] in _ENV_ROUTES:
            env_key, route = next(iter(self.envs)), parts[0]
        elif len(parts) == 2 and parts[0].lower() in self.envs and parts[1] in _ENV_ROUTES:
            env_key, route = parts[0].lower(), parts[1]
        else:
            raise HttpError(404, "not_found", f"no route {method} {path}")
        env = self.envs[env_key]
        if route in _SESSION_ROUTES:
            entry = self._entry(_sid(headers))
            if entry.env is not env:
                raise HttpError(400, "bad_request", f"session is of environment "
                                f"{entry.env.name!r}, not {env.name!r}")
            entry.last_used = time.monotonic()
            if route == "prompt" and method == "GET":
                return [{"type": "text", "text": entry.prompt}]
            if route == "task_tools" and method == "GET":
                return {"tools": [tool_json(t) for t in entry.task.tools],
                        "terminal_tool": TERMINAL_JSON}
            if route == "call" and method == "POST":
                return SseReply(self._call_stream(entry, body))
        elif method == "GET" and route == EXTENSION:
            return {"extension": EXTENSION, "version": EXTENSION_VERSION, "name": env.name,
                    "uses_workspace": bool(env.uses_workspace),
                    "vocabulary": list(env.vocabulary())}
        elif method == "GET" and route == "splits":
            return [{"name": "train", "type": "train"}, {"name": "heldout", "type": "test"}]
        elif method == "GET" and route == "tools":
            with self._env_lock:
                task = env.task(env.task_ids(Split.TRAIN)[0])
            return {"tools": [tool_json(t) for t in task.tools], "terminal_tool": TERMINAL_JSON}
        elif method == "POST":
            split = _split(body)
            with self._env_lock:
                ids = env.task_ids(split)
            if route == "tasks":
                return {"tasks": [{"task_id": i} for i in ids], "env_name": env_key}
            if route == "num_tasks":
                return {"num_tasks": len(ids)}
            if route == "task":
                return {"task": {"task_id": _index(ids, body)}, "env_name": env_key}
        raise HttpError(404, "not_found", f"no route {method} {path}")

    def _entry(self, sid: str) -> _Open:
        with self._lock:
            entry = self._sessions.get(sid)
        if entry is None or entry.closed:
            raise HttpError(404, "unknown_session", f"no open session {sid!r} (deleted, idle "
                            f"over {self.limits.session_ttl_s:g} s, or never created)")
        return entry

    def _create(self, sid: str, body: dict) -> dict:
        name = body.get("env_name")
        if name is None:
            env_key = next(iter(self.envs))
        elif isinstance(name, str) and name.lower() in self.envs:
            env_key = name.lower()
        else:
            raise HttpError(404, "not_found", f"unknown environment {name!r} (serving "
                            f"{sorted(self.envs)})")
        env = self.envs[env_key]
        spec = body.get("task_spec")
        if (spec is None) == ("split" not in body and "index" not in body):
            raise HttpError(400, "bad_request", "create: give task_spec or split and index, "
                            "exactly one of them")
        if spec is None:
            split = _split(body)
            with self._env_lock:
                spec = {"task_id": _index(env.task_ids(split), body)}
        task_id = wire.field(spec, "task_id", str, "task_spec")
        seed = spec.get("seed", 0)
        budget = spec.get("budget", self.budget)
        clock = spec.get("clock_s")
        for key, value, kinds in (("seed", seed, int), ("budget", budget, int),
                                  ("clock_s", clock, (int, float, type(None)))):
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise HttpError(400, "bad_request", f"task_spec field {key!r} has "
                                f"{type(value).__name__} {value!r}")
        extended = body.get("avalon")
        if extended is not None and (isinstance(extended, bool) or extended != EXTENSION_VERSION):
            raise HttpError(400, "bad_request", f"create: field 'avalon' must be "
                            f"{EXTENSION_VERSION} (the extension's version), got {extended!r}")
        self._reap_idle()
        with self._lock:  # the slot is taken here, before the (maybe slow) on_start
            if sid in self._sessions or sid in self._creating:
                raise HttpError(400, "bad_request", f"session {sid!r} already exists")
            if len(self._sessions) + len(self._creating) >= self.limits.max_sessions:
                raise HttpError(400, "bad_request", f"{self.limits.max_sessions} sessions are "
                                f"open or opening (the limit): delete some")
            self._creating.add(sid)
        root = None
        try:
            with self._env_lock:
                session = env.session(task_id, seed, clock)
            root = self.session_dirs.new()
            ws = Workspace(root)
            task = session.task
            if extended is None:  # plain ORS: started here, the CEO's brief in the prompt
                session.on_start(budget, ws)
                brief = session.brief("ceo", 0, "CEO", "")
                prompt = task.prompt + (f"\n\n{brief}" if brief else "")
            else:  # the extension's client starts it and asks for each brief
                prompt = task.prompt
            entry = _Open(env, session, task, prompt, ws, root, threading.Lock(),
                          time.monotonic(), extended=extended is not None)
            with self._lock:
                self._sessions[sid] = entry
                self._creating.discard(sid)
        except BaseException:
            with self._lock:
                self._creating.discard(sid)
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
            raise
        if extended is not None:
            return {"sid": sid, EXTENSION: {"task": wire.task_to_json(task)}}
        return {"sid": sid}

    def _reap_idle(self) -> None:
        """Drops sessions unused for `session_ttl_s` (one scan per quarter TTL, or when full)."""
        now = time.monotonic()
        ttl = self.limits.session_ttl_s
        with self._lock:
            if len(self._sessions) < self.limits.max_sessions and now < self._next_reap:
                return
            self._next_reap = now + ttl / 4
            stale = [(sid, e) for sid, e in self._sessions.items() if now - e.last_used > ttl]
        for sid, entry in stale:
            with self._lock:  # not while a call of it runs (or waits to)
                busy = any(not j.done.is_set() for j in entry.jobs.values())
            if not busy:
                self._drop(sid, entry)
                self.reaped += 1

    def _drop(self, sid: str, entry: _Open, wait_s: float = 0.0) -> None:
        """Closes the session: no call of it starts its tool from now on; waits up to `wait_s`
        for those running, then removes its directory (else the last one to end does, in
        `_run`)."""
        with self._lock:
            entry.closed = True
            self._sessions.pop(sid, None)
            if wait_s > 0:
                self._calls_ended.wait_for(lambda: entry.running == 0, wait_s)
            idle = entry.running == 0
        if idle:
            shutil.rmtree(entry.root, ignore_errors=True)

    # ----- calls -----

    def _call_stream(self, entry: _Open, body: dict):
        name = wire.field(body, "name", str, "call request")
        args = body.get("input", {})
        if not isinstance(args, dict):
            raise HttpError(400, "bad_request", f"call request: field 'input' must be an "
                            f"object, got {type(args).__name__}")
        replay = body.get("task_id")
        if replay is not None and not isinstance(replay, str):
            raise HttpError(400, "bad_request", f"call request: field 'task_id' has "
                            f"{type(replay).__name__} {replay!r}")
        if replay is not None:
            with self._lock:
                job = entry.jobs.get(replay)
            return _job_stream(job, replay)
        extended = body.get(EXTENSION)
        if (extended is not None) != entry.extended:
            raise HttpError(400, "bad_request", "call request: field 'avalon' is required on a "
                            "session created with the extension, and only there")
        if extended is not None:  # checked now: a malformed request is a 400, not a result
            wire.call_ctx_from_json(wire.field(extended, "ctx", dict, "call request avalon"),
                                    entry.workspace)
            if entry.env.uses_workspace:
                wire.field(extended, "workspace", dict, "call request avalon")
        job = _Job(uuid.uuid4().hex)
        with self._lock:
            if entry.closed:  # deleted since `_entry` found it
                raise HttpError(404, "unknown_session", "the session was deleted")
            running = [k for k, j in entry.jobs.items() if not j.done.is_set()]
            if len(running) >= REPLAYS_KEPT:  # each waits on the session's lock in a thread
                raise HttpError(429, "too_many_calls", f"{len(running)} calls of this session "
                                f"are in flight (the limit): wait for their results")
            entry.jobs[job.task_id] = job
            finished = [k for k, j in entry.jobs.items() if j.done.is_set()]
            for k in finished[:max(0, len(entry.jobs) - REPLAYS_KEPT)]:  # oldest first
                del entry.jobs[k]
            entry.running += 1
        try:
            self.start_worker(self._run, entry, name, args, job, extended,
                              name=f"ors-call-{name}")
        except BaseException:
            self._call_ended(entry)
            raise
        return _job_stream(job, job.task_id)

    def _run(self, entry: _Open, name: str, args: dict, job: _Job,
             extended: dict | None) -> None:
        try:
            entry.last_used = time.monotonic()
            result = self._ordered(entry, name, args, extended)
            job.result = json.dumps(result, allow_nan=False, separators=(",", ":"))
        except Exception as e:  # a bug in the environment (or a NaN reward): event: error
            job.error = f"{entry.env.name} tool {name!r}: {type(e).__name__}: {e}"
        finally:
            entry.last_used = time.monotonic()
            job.done.set()
            self._call_ended(entry)

    def _call_ended(self, entry: _Open) -> None:
        """One call of `entry` returned: the last one of a deleted session removes its
        directory (a call may have written its mirror after the delete began)."""
        with self._lock:
            entry.running -= 1
            last = entry.closed and entry.running == 0
            self._calls_ended.notify_all()
        if last:
            shutil.rmtree(entry.root, ignore_errors=True)

    def _ordered(self, entry: _Open, name: str, args: dict, extended: dict | None) -> dict:
        """Runs one call in the SDK's order (module docstring): `_invoke_tool_fn`."""
        if entry.closed:
            return _deleted(name)
        if entry.finished:
            return _finished(name)
        spec = next((t for t in entry.task.tools if t.name == name), None)
        if extended is None:
            outcome = self._outcome
        else:
            outcome = functools.partial(self._extended_outcome, extended=extended)
        if name == FINAL_TOOL or (spec is not None and spec.exclusive):
            with entry.gate.exclusive():
                return outcome(entry, name, args)
        if spec is not None and spec.concurrent:
            with entry.gate.shared():
                return outcome(entry, name, args)
        # The tool lock outside the gate: calls queued on a tool do not hold off an exclusive.
        with entry.tool_lock(name), entry.gate.shared():
            return outcome(entry, name, args)

    def _outcome(self, entry: _Open, name: str, args: dict) -> dict:
        if entry.closed:
            return _deleted(name)
        if entry.finished:  # the call this one queued behind ended the episode
            return _finished(name)
        if name == FINAL_TOOL:
            message = args.get("message", "")
            if set(args) - {"message"} or not isinstance(message, str):
                return _refused(f"{FINAL_TOOL} takes one string argument 'message', got "
                                f"{sorted(args)}", "input_validation")
            with self._state(entry):
                final = self._end(entry, EndReason.FINAL_MESSAGE, message)
            if final is None:
                return _finished(name)
            return _ok(f"episode ended: {message}", final_reward(final), True,
                       _final_metadata(final))
        spec = next((t for t in entry.task.tools if t.name == name), None)
        if spec is None:
            return _refused(f"{name!r} is not a valid tool", "not_found")
        problem = spec.check_args(args)
        if problem is not None:
            return _refused(problem, "input_validation")
        with self._state(entry):
            if entry.closed:  # deleted while this call waited
                return _deleted(name)
            if entry.finished:  # a concurrent call ended it while this one waited
                return _finished(name)
            ctx = CallContext(agent="ceo", title="CEO", clock_s=entry.clock_s, tokens_out=0,
                              workspace=entry.workspace)
            try:
                out = entry.session.call(name, dict(args), ctx)
            except ToolError as e:
                return _ok(str(e), None, False, {"error": True})
            with entry.latch:
                if entry.finished:  # the first finished wins: this result is discarded
                    return _finished(name)
                entry.clock_s += max(0.0, float(out.duration_s))
            metadata = _call_metadata(out)
            reward = sum(r.value for r in out.rewards) if out.rewards else None
            if out.terminal:
                final = self._end(entry, EndReason.ENV_TERMINAL, None)
                if final is None:
                    return _finished(name)
                metadata["final"] = _final_metadata(final)
                if final.rewards:
                    reward = (reward or 0.0) + final_reward(final)
        return _ok(out.text, None if reward is None else float(reward), out.terminal, metadata)

    def _extended_outcome(self, entry: _Open, name: str, args: dict, extended: dict) -> dict:
        """A call of an extended session (docs/ors_extension.md): the caller's context, the
        client's workspace mirrored first, the environment's own outcome or ToolError message
        in `metadata.avalon`, and the workspace back when the call changed it. The episode
        ends only at `avalon/end`, as in-process (a terminal outcome is the client's to act
        on)."""
        if entry.closed:
            return _deleted(name)
        if entry.finished:
            return _finished(name)
        spec = next((t for t in entry.task.tools if t.name == name), None)
        problem = f"{name!r} is not a valid tool" if spec is None else spec.check_args(args)
        if problem is not None:
            return _tool_error(problem)
        mirrors = bool(entry.env.uses_workspace)
        with entry.lock if mirrors else self._state(entry):  # the mirror is the session's
            if entry.closed:  # deleted while this call waited
                return _deleted(name)
            if entry.finished:
                return _finished(name)
            before = extended.get("workspace") if mirrors else None
            if mirrors:  # what the agents left in their workspace is theirs: a tool error
                try:
                    wire.restore(entry.workspace, before)
                except wire.WireError as e:
                    return _tool_error(str(e))
                if entry.closed:  # deleted during the restore: the tool does not run
                    return _deleted(name)
            ctx = wire.call_ctx_from_json(extended["ctx"], entry.workspace)
            try:
                out = entry.session.call(name, dict(args), ctx)
                ext = {"outcome": wire.outcome_to_json(out)}
            except ToolError as e:
                out, ext = None, {"tool_error": str(e)}
            if mirrors:
                after, _ = wire.snapshot(entry.workspace)
                if after["files"] != before["files"]:
                    ext["workspace"] = after
        if out is None:
            return _ok(ext["tool_error"], None, False, {"error": True, EXTENSION: ext})
        reward = float(sum(r.value for r in out.rewards)) if out.rewards else None
        return _ok(out.text, reward, out.terminal, {**_call_metadata(out), EXTENSION: ext})

    def _extension(self, env: Environment, op: str, body: dict, headers) -> dict:
        """The extension's own routes (docs/ors_extension.md): `avalon/task` for any client,
        `avalon/start`, `avalon/brief` and `avalon/end` for a session created with it. Each
        session route waits for the session's calls in flight and holds new ones (the SDK's
        exclusive gate), as the in-process organisation never overlaps them."""
        if op == "task":
            task_id = wire.field(body, "task_id", str, "task request")
            clock = wire.field(body, "clock_s", (int, float, type(None)), "task request")
            with self._env_lock:
                return {"task": wire.task_to_json(env.task(task_id, clock))}
        if op not in ("start", "brief", "end"):
            raise HttpError(404, "not_found", f"no extension route {EXTENSION}/{op}")
        sid = _sid(headers)
        entry = self._entry(sid)
        if entry.env is not env:
            raise HttpError(400, "bad_request", f"session is of environment "
                            f"{entry.env.name!r}, not {env.name!r}")
        if not entry.extended:
            raise HttpError(400, "bad_request", f"session {sid!r} was created without the "
                            f"{EXTENSION} extension")
        entry.last_used = time.monotonic()
        try:
            with entry.gate.exclusive(), entry.lock:
                if entry.closed:
                    raise HttpError(404, "unknown_session", f"no open session {sid!r}")
                return self._extended_op(sid, entry, op, body)
        finally:
            entry.last_used = time.monotonic()

    def _extended_op(self, sid: str, entry: _Open, op: str, body: dict) -> dict:
        if op == "brief":
            w = "brief request"
            return {"text": entry.session.brief(
                wire.field(body, "agent", str, w), wire.field(body, "index", int, w),
                wire.field(body, "title", str, w), wire.field(body, "role", str, w))}
        if op == "start":
            budget = wire.field(body, "budget", int, "start request")
            before = self._mirror(entry, body, lenient=False)
            entry.session.on_start(budget, entry.workspace)
            reply: dict = {}
            if before is not None:
                after, _ = wire.snapshot(entry.workspace)
                if after["files"] != before["files"]:
                    reply["workspace"] = after
            return reply
        try:  # the end: the session is gone afterwards, whatever happens
            with entry.latch:
                entry.finished = True
            # What the mirror cannot take (a name or size the workspace refuses) is left out,
            # never the end refused: every episode is graded.
            self._mirror(entry, body, lenient=True)
            ctx = wire.end_ctx_from_json(wire.field(body, "ctx", dict, "end request"),
                                         entry.workspace)
            final = entry.session.on_end(ctx)
        finally:
            self._drop(sid, entry)
        return {"final": wire.final_to_json(final)}

    @staticmethod
    def _mirror(entry: _Open, body: dict, lenient: bool) -> dict | None:
        """Writes the client's workspace snapshot into the session's directory when the
        environment reads workspaces; returns the snapshot (None when it does not)."""
        if not entry.env.uses_workspace:
            return None
        snap = wire.field(body, "workspace", dict, "request")
        wire.restore(entry.workspace, snap, lenient=lenient)
        return snap

    @staticmethod
    def _state(entry: _Open):
        """The session's own lock around a call, unless its environment's sessions are
        thread-safe (`concurrent_sessions`)."""
        if getattr(entry.env, "concurrent_sessions", False):
            return contextlib.nullcontext()
        return entry.lock

    def _end(self, entry: _Open, reason: EndReason, message: str | None) -> FinalOutcome | None:
        """Ends the episode, once: None when another call already did."""
        with entry.latch:
            if entry.finished:
                return None
            entry.finished = True
            clock = entry.clock_s
        return entry.session.on_end(EndContext(reason, message, clock, entry.workspace))


def final_reward(final: FinalOutcome) -> float:
    return float(sum(r.value for r in final.rewards))


def _final_metadata(final: FinalOutcome) -> dict:
    return wire.final_to_json(final)


def _call_metadata(out) -> dict:
    """What ORS has no field for: the labelled rewards, the declared duration, the error flag."""
    return {"rewards": wire.rewards_to_json(out.rewards), "duration_s": float(out.duration_s),
            "measured": out.measured, "error": out.error}


def _tool_error(message: str) -> dict:
    """An extended call refused before it ran: an ORS result flagged `error`, the message in
    `metadata.avalon.tool_error`."""
    return _ok(message, None, False, {"error": True, EXTENSION: {"tool_error": message}})


def _ok(text: str, reward: float | None, finished: bool, metadata: dict) -> dict:
    return {"ok": True, "output": {"blocks": [{"type": "text", "text": text}],
                                   "metadata": metadata, "reward": reward,
                                   "finished": finished}}


def _refused(error: str, reason: str) -> dict:
    return {"ok": False, "error": error, "reason": reason}


def _deleted(name: str) -> dict:
    return _refused(f"{name!r} was not run: the session was deleted", "not_found")


def _finished(name: str) -> dict:
    return _refused(f"{name!r} was not run: the episode has finished, so no further tool calls "
                    "are accepted", "episode_finished")


def _sid(headers) -> str:
    sid = (headers.get("X-Session-ID") or "").strip()
    if not sid:
        raise HttpError(400, "bad_request", "X-Session-ID header is required")
    return sid


def _split(body: dict) -> Split:
    name = wire.field(body, "split", str, "request")
    if name not in SPLITS:
        raise HttpError(400, "bad_request", f"split must be one of {sorted(SPLITS)}, got "
                        f"{name!r}")
    return SPLITS[name]


def _index(ids: Sequence[str], body: dict) -> str:
    index = wire.field(body, "index", int, "request")
    if not 0 <= index < len(ids):
        raise HttpError(400, "bad_request", f"index {index} is out of range (0..{len(ids) - 1})")
    return ids[index]


def _session_id_stream(sid: str):
    yield "task_id", sid
    yield "end", ""


def _job_stream(job: _Job | None, task_id: str):
    if job is None:
        yield "error", f"unknown task_id {task_id!r}"
        return
    yield "task_id", job.task_id
    while not job.done.wait(PING_S):
        yield None
    if job.error is not None:
        yield "error", job.error
        return
    yield from chunks(job.result)


def chunks(text: str, size: int = CHUNK_CHARS) -> list[tuple[str, str]]:
    """`text` as `chunk` events of at most `size` characters and a final `end`. No piece starts
    with whitespace: SSE readers (the SDK's among them) strip a data line's leading spaces."""
    out, i = [], 0
    while len(text) - i > size:
        cut = i + size
        while cut > i + 1 and text[cut].isspace():
            cut -= 1
        out.append(("chunk", text[i:cut]))
        i = cut
    out.append(("end", text[i:]))
    return out
