"""The protocol between the organisation simulator and an environment session.

`avalon/org` never imports `avalon/envs`: environments implement this protocol (and the envs
package imports org). One `EnvSession` serves one rollout; the simulator calls it from one
thread, in event-log order, so a session needs no locks and must be deterministic given its
construction (seed) and the sequence of calls.

Order. Under the clock scheduler (the default, `avalon/org/schedule.py`) `call`s arrive in the
order of their start on the derived clock: `CallContext.clock_s` never decreases from one call
to the next (ties: the agent hired first), and a call sees every call that started before it
and none that started after, so the first agent on the clock wins a race for a resource. A
call happens at its start; its `duration_s` is charged after. With
`OrgConfig.schedule_horizon_s=inf` (lock-step) calls come in tick order instead.

The calls a session receives, in order:
1. `task` (a property), at rollout start: the prompt, the environment's tools, the clock cap.
   Then `on_start(budget, workspace)` once: the rollout's hire budget b, and its (empty)
   workspace directory, for environments that lay out files (a repository to build on).
2. `brief(agent, index, title, role)` for the CEO (index 0) at start and for each hire (index
   1, 2, ... in hire order): private text placed in that agent's system prompt ("" for none). A
   hidden-profile environment deals its facts here (it knows b from `on_start`).
3. `call(tool, args, ctx)` for each call of one of the task's tools, args already checked
   against the tool's `Param`s. Return a `ToolOutcome`; raise `ToolError(message)` (or return
   `error=True`) when the call is invalid or fails: the agent sees the message, the turn is a
   tool-error step. Any other exception is a bug in the environment and propagates.
4. `on_end(ctx)` once: final rewards (attached to the CEO at the `end` event) and, for wealth
   environments, the wealth ratio W_T / W_0.

Durations: `ToolOutcome.duration_s` is the tool's *declared* cost in seconds of the derived
clock (simulated work: a subtask's work cost). Declared costs keep event logs byte-identical for
the same seed and outputs. A tool that really executes something may report its measured wall
time instead and set `measured=True` (the log marks it; such logs are not reproducible).

Rewards: each `EnvReward` becomes a `RewardEvent` on the calling agent with the tool call's
event seq. Rewards of a call that ends after the task's wall-clock cap are dropped (logged as
`late`): only work finished in time counts.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from avalon.org.errors import ToolError as ToolError  # part of the protocol (errors.py)
from avalon.rl.types import Objective

if TYPE_CHECKING:
    from avalon.org.workspace import Workspace

TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class ParamType(enum.Enum):
    """JSON types of tool arguments."""

    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    ARRAY = "array"
    OBJECT = "object"

    def accepts(self, value: Any) -> bool:
        """Whether a JSON-decoded value has this type (booleans are not numbers)."""
        if self is ParamType.BOOLEAN:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self is ParamType.INTEGER:
            return isinstance(value, int)
        if self is ParamType.NUMBER:
            return isinstance(value, (int, float)) and math.isfinite(value)
        kinds = {ParamType.STRING: str, ParamType.ARRAY: list, ParamType.OBJECT: dict}
        return isinstance(value, kinds[self])


@dataclasses.dataclass(frozen=True)
class Param:
    """One argument of a tool."""

    name: str
    type: ParamType
    description: str = ""
    required: bool = True


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool an agent can call: name, what it does, its arguments.

    `grantable`: the CEO may give it to a specialist at hire. A tool that is not grantable stays
    with the CEO (e.g. an environment's final `submit`).

    `concurrent` and `exclusive`: how a server that several clients call at once orders its
    calls, with the meaning of the `openreward` SDK's `@tool(concurrent=, exclusive=)`
    (`avalon/envs/ors_server.py`): by default calls to one tool run one at a time; a
    `concurrent` tool (one that grants no reward: reads, searches) skips that; an `exclusive`
    tool (one that ends the episode) waits for every call in flight and holds new ones (it wins
    over `concurrent`). The organisation calls a session from one thread and ignores them.
    """

    name: str
    description: str
    params: tuple[Param, ...] = ()
    grantable: bool = True
    concurrent: bool = False
    exclusive: bool = False

    def __post_init__(self):
        if not TOOL_NAME.fullmatch(self.name):
            raise ValueError(f"ToolSpec.name {self.name!r} must match {TOOL_NAME.pattern}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"ToolSpec {self.name!r} repeats a param name: {names}")

    def signature(self) -> str:
        """`name(a, b?)`: optional params marked with `?`."""
        args = ", ".join(p.name + ("" if p.required else "?") for p in self.params)
        return f"{self.name}({args})"

    def json_schema(self) -> dict:
        """The arguments as a JSON-schema object (for tool-use formats that want one)."""
        return {"type": "object",
                "properties": {p.name: {"type": p.type.value, "description": p.description}
                               for p in self.params},
                "required": [p.name for p in self.params if p.required]}

    def check_args(self, args: Mapping[str, Any]) -> str | None:
        """The first problem with `args` as an error message, or None when they are valid."""
        known = {p.name: p for p in self.params}
        for key in args:
            if key not in known:
                return f"{self.name}: unknown argument {key!r} (takes {self.signature()})"
        for p in self.params:
            if p.name not in args:
                if p.required:
                    return f"{self.name}: missing argument {p.name!r} ({self.signature()})"
                continue
            if not p.type.accepts(args[p.name]):
                return (f"{self.name}: argument {p.name!r} must be {p.type.value}, "
                        f"got {type(args[p.name]).__name__}")
        return None


@dataclasses.dataclass(frozen=True)
class Task:
    """What an environment hands the organisation at rollout start."""

    task_id: str
    prompt: str  # the task as the CEO reads it
    tools: tuple[ToolSpec, ...]  # the environment's tools (the CEO has all of them)
    wall_clock_s: float  # cap on every agent's derived clock (SPEC §2), seconds
    objective: Objective = Objective.SUM
    # The S8 baseline (SPEC §5): final_message is refused, with the "keep improving" message,
    # until the organisation has sampled this many output tokens (0: never refused). The
    # environment's own submission tools are gated by `avalon/envs/keep_improving.py`.
    submit_after_tokens: int = 0

    def __post_init__(self):
        if not self.wall_clock_s > 0:
            raise ValueError(f"Task.wall_clock_s must be > 0, got {self.wall_clock_s!r} "
                             f"(task {self.task_id!r})")
        if isinstance(self.submit_after_tokens, bool) or not isinstance(
                self.submit_after_tokens, int) or self.submit_after_tokens < 0:
            raise ValueError(f"Task.submit_after_tokens must be an int >= 0, got "
                             f"{self.submit_after_tokens!r} (task {self.task_id!r})")


@dataclasses.dataclass(frozen=True)
class EnvReward:
    value: float
    label: str = ""


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    """The result of one environment tool call."""

    text: str  # what the agent reads
    rewards: tuple[EnvReward, ...] = ()
    terminal: bool = False  # the episode ends after this turn's tick
    duration_s: float = 0.0  # declared cost on the derived clock (see module docstring)
    measured: bool = False  # duration_s is a measured wall time, not a declared cost
    error: bool = False  # the call failed: a tool-error step


class EndReason(enum.Enum):
    FINAL_MESSAGE = "final_message"  # the CEO called final_message
    ENV_TERMINAL = "env_terminal"  # an environment tool returned terminal=True
    WALL_CLOCK = "wall_clock"  # no agent can act and at least one hit the clock cap
    DEADLOCK = "deadlock"  # no agent can act: the rest wait with nothing in flight
    STOPPED = "stopped"  # every agent stopped (turn cap, context full) or fired


@dataclasses.dataclass(frozen=True)
class CallContext:
    """Who is calling an environment tool, and when."""

    agent: str  # "ceo", "a1", ...
    title: str
    clock_s: float  # the agent's derived clock when the call starts
    tokens_out: int  # tokens sampled so far by the whole organisation (S8-style gates)
    workspace: Workspace  # the rollout's sandboxed directory


@dataclasses.dataclass(frozen=True)
class EndContext:
    reason: EndReason
    final_message: str | None  # the CEO's final message, if it sent one
    latency_s: float  # task latency so far (largest agent clock)
    workspace: Workspace


@dataclasses.dataclass(frozen=True)
class FinalOutcome:
    rewards: tuple[EnvReward, ...] = ()  # attached to the CEO at the `end` event
    wealth_ratio: float | None = None  # W_T / W_0, for GKPO environments
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # What the environment knows and the agents were not told (ground truth for the analysis,
    # e.g. which builds were defective: `avalon/analysis/reviews.py`), as plain JSON. Logged in
    # the `end` event with the metrics; never shown to an agent.
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class EnvSession(Protocol):
    """One rollout's environment. See the module docstring for the call order."""

    @property
    def task(self) -> Task: ...

    def on_start(self, budget: int, workspace: Workspace) -> None: ...

    def brief(self, agent: str, index: int, title: str, role: str) -> str: ...

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome: ...

    def on_end(self, ctx: EndContext) -> FinalOutcome: ...
