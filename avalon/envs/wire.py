"""JSON forms of the environment protocol's values, shared by the HTTP server and client.

Tools travel as `{"name", "description", "grantable", "parameters"}` with `parameters` the
tool's JSON schema (`ToolSpec.json_schema()`); the client rebuilds `ToolSpec`s from it (schema
properties keep their order in JSON objects). Decoders check every field and raise `WireError`
naming the field and the value, never a KeyError deep inside.

Workspaces: an environment with `uses_workspace` reads the rollout's workspace, which lives on
the client. The client sends a snapshot `{"files": {path: base64}}` with each call and with the
end; the server writes it into the session's own directory (paths checked by the org's
`Workspace`) before calling the real session. Environments served this way must treat the
workspace as read-only: changes they make are not sent back.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Mapping
from typing import Any

from avalon.org.env import (
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


class WireError(ValueError):
    """A JSON message that does not have the expected shape."""


def field(obj: Any, key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    """obj[key], checked to be one of `kinds` (bool is never accepted as a number)."""
    if not isinstance(obj, Mapping):
        raise WireError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise WireError(f"{where}: missing field {key!r}")
    value = obj[key]
    bool_ok = kinds is bool or (isinstance(kinds, tuple) and bool in kinds)
    if not isinstance(value, kinds) or (isinstance(value, bool) and not bool_ok):
        raise WireError(f"{where}: field {key!r} has {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise WireError(f"{where}: field {key!r} is not finite ({value!r})")
    return value


def tool_to_json(spec: ToolSpec) -> dict:
    return {"name": spec.name, "description": spec.description, "grantable": spec.grantable,
            "parameters": spec.json_schema()}


def tool_from_json(obj: Any) -> ToolSpec:
    where = "tool"
    name = field(obj, "name", str, where)
    where = f"tool {name!r}"
    schema = field(obj, "parameters", dict, where)
    props = field(schema, "properties", dict, f"{where} parameters")
    required = field(schema, "required", list, f"{where} parameters")
    params = []
    for pname, prop in props.items():
        ptype = field(prop, "type", str, f"{where} parameter {pname!r}")
        try:
            kind = ParamType(ptype)
        except ValueError:
            raise WireError(f"{where} parameter {pname!r}: unknown type {ptype!r}") from None
        desc = prop.get("description", "") if isinstance(prop, dict) else ""
        params.append(Param(pname, kind, desc if isinstance(desc, str) else "",
                            required=pname in required))
    try:
        return ToolSpec(name, field(obj, "description", str, where), tuple(params),
                        grantable=field(obj, "grantable", bool, where))
    except ValueError as e:
        raise WireError(f"{where}: {e}") from None


def task_to_json(task: Task) -> dict:
    return {"task_id": task.task_id, "prompt": task.prompt,
            "tools": [tool_to_json(t) for t in task.tools], "wall_clock_s": task.wall_clock_s,
            "objective": task.objective.value}


def task_from_json(obj: Any) -> Task:
    where = "task"
    objective = field(obj, "objective", str, where)
    try:
        obj_enum = Objective(objective)
    except ValueError:
        raise WireError(f"{where}: unknown objective {objective!r}") from None
    try:
        return Task(task_id=field(obj, "task_id", str, where),
                    prompt=field(obj, "prompt", str, where),
                    tools=tuple(tool_from_json(t) for t in field(obj, "tools", list, where)),
                    wall_clock_s=float(field(obj, "wall_clock_s", (int, float), where)),
                    objective=obj_enum)
    except ValueError as e:
        if isinstance(e, WireError):
            raise
        raise WireError(f"{where}: {e}") from None


def rewards_to_json(rewards) -> list:
    return [{"value": float(r.value), "label": r.label} for r in rewards]


def rewards_from_json(items: Any, where: str) -> tuple[EnvReward, ...]:
    if not isinstance(items, list):
        raise WireError(f"{where}: rewards must be a list, got {type(items).__name__}")
    return tuple(EnvReward(float(field(r, "value", (int, float), where)),
                           field(r, "label", str, where)) for r in items)


def outcome_to_json(out: ToolOutcome) -> dict:
    return {"text": out.text, "rewards": rewards_to_json(out.rewards), "terminal": out.terminal,
            "duration_s": float(out.duration_s), "measured": out.measured, "error": out.error}


def outcome_from_json(obj: Any) -> ToolOutcome:
    where = "tool outcome"
    return ToolOutcome(text=field(obj, "text", str, where),
                       rewards=rewards_from_json(field(obj, "rewards", list, where), where),
                       terminal=field(obj, "terminal", bool, where),
                       duration_s=float(field(obj, "duration_s", (int, float), where)),
                       measured=field(obj, "measured", bool, where),
                       error=field(obj, "error", bool, where))


def final_to_json(final: FinalOutcome) -> dict:
    return {"rewards": rewards_to_json(final.rewards),
            "wealth_ratio": None if final.wealth_ratio is None else float(final.wealth_ratio),
            "metrics": {k: float(v) for k, v in final.metrics.items()}}


def final_from_json(obj: Any) -> FinalOutcome:
    where = "final outcome"
    ratio = field(obj, "wealth_ratio", (int, float, type(None)), where)
    metrics = field(obj, "metrics", dict, where)
    return FinalOutcome(rewards=rewards_from_json(field(obj, "rewards", list, where), where),
                        wealth_ratio=None if ratio is None else float(ratio),
                        metrics={k: float(field(metrics, k, (int, float), f"{where} metrics"))
                                 for k in metrics})


def call_ctx_to_json(ctx: CallContext) -> dict:
    return {"agent": ctx.agent, "title": ctx.title, "clock_s": float(ctx.clock_s),
            "tokens_out": int(ctx.tokens_out)}


def call_ctx_from_json(obj: Any, workspace: Workspace) -> CallContext:
    where = "call context"
    return CallContext(agent=field(obj, "agent", str, where), title=field(obj, "title", str, where),
                       clock_s=float(field(obj, "clock_s", (int, float), where)),
                       tokens_out=field(obj, "tokens_out", int, where), workspace=workspace)


def end_ctx_to_json(ctx: EndContext) -> dict:
    return {"reason": ctx.reason.value, "final_message": ctx.final_message,
            "latency_s": float(ctx.latency_s)}


def end_ctx_from_json(obj: Any, workspace: Workspace) -> EndContext:
    where = "end context"
    reason = field(obj, "reason", str, where)
    try:
        reason_enum = EndReason(reason)
    except ValueError:
        raise WireError(f"{where}: unknown reason {reason!r}") from None
    return EndContext(reason=reason_enum,
                      final_message=field(obj, "final_message", (str, type(None)), where),
                      latency_s=float(field(obj, "latency_s", (int, float), where)),
                      workspace=workspace)


def snapshot(ws: Workspace) -> dict:
    """Every file of a workspace as {relative path: base64 bytes}."""
    files = {}
    for rel in ws.listdir("."):
        path = ws.resolve(rel)
        if path.is_file() and not path.is_symlink():
            files[rel] = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"files": files}


def restore(ws: Workspace, snap: Any) -> None:
    """Makes `ws` hold exactly the snapshot's files (paths checked like the file tools)."""
    files = field(snap, "files", dict, "workspace snapshot")
    for rel in ws.listdir("."):
        if rel not in files:
            os.unlink(ws.resolve(rel))
    total = 0
    for rel, data in files.items():
        if not isinstance(data, str):
            raise WireError(f"workspace snapshot: file {rel!r} is not base64 text")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise WireError(f"workspace snapshot: file {rel!r} is not valid base64") from None
        total += len(raw)
        if len(raw) > ws.limits.max_file_bytes or total > ws.limits.max_total_bytes:
            raise WireError(f"workspace snapshot: over the workspace limits at {rel!r}")
        try:
            path = ws.resolve(rel)  # refuses '..', absolute paths, escapes
        except ToolError as e:
            raise WireError(f"workspace snapshot: {e}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
