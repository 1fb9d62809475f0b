"""JSON forms of the environment protocol's values, shared by the ORS server and client (the
Avalon extension, docs/ors_extension.md).

Tools travel as `{"name", "description", "grantable", "concurrent", "exclusive", "parameters"}`
with `parameters` the tool's JSON schema (`ToolSpec.json_schema()`); the client rebuilds
`ToolSpec`s from it (schema properties keep their order in JSON objects). Decoders check every
field and raise `WireError` naming the field and the value, never a KeyError deep inside.

Workspaces: an environment with `uses_workspace` reads the rollout's workspace, which lives on
the client. The client sends a snapshot `{"files": {path: base64}}` with each call and with the
end; the server writes it into the session's own directory before calling the real session.
A snapshot holds only the regular files the file tools can name, within the workspace's caps
(`snapshot` also says what it left out); `restore` refuses bad paths and snapshots over the
caps with a `WireError` (or, `lenient`, at the end of an episode, leaves such files out) and
removes whatever the snapshot does not hold, emptied directories included. Both use the
Workspace's race-free file operations (see the section below), so what sandboxed code leaves
behind (links, FIFOs) can neither redirect nor crash them.
Changes an environment makes (a layout in `on_start`, files in a call) come back in the reply.
"""

from __future__ import annotations

import base64
import math
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
            "concurrent": spec.concurrent, "exclusive": spec.exclusive,
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
    flags = {k: field(obj, k, bool, where) if k in obj else False
             for k in ("concurrent", "exclusive")}  # absent: a server from before them
    try:
        return ToolSpec(name, field(obj, "description", str, where), tuple(params),
                        grantable=field(obj, "grantable", bool, where), **flags)
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
            "metrics": {k: float(v) for k, v in final.metrics.items()},
            "record": dict(final.record)}


def final_from_json(obj: Any) -> FinalOutcome:
    where = "final outcome"
    ratio = field(obj, "wealth_ratio", (int, float, type(None)), where)
    metrics = field(obj, "metrics", dict, where)
    record = field(obj, "record", dict, where) if "record" in obj else {}
    return FinalOutcome(rewards=rewards_from_json(field(obj, "rewards", list, where), where),
                        wealth_ratio=None if ratio is None else float(ratio),
                        metrics={k: float(field(metrics, k, (int, float), f"{where} metrics"))
                                 for k in metrics}, record=record)


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


# ----- workspace snapshots -----
# Both go through the Workspace's own file operations, which work by descriptors beneath the
# root and follow no symlink on any component (avalon/org/beneath.py): what sandboxed code
# leaves behind (links to /proc/self/cwd, FIFOs, names no tool accepts) is invisible to them,
# and a link swapped in meanwhile cannot redirect them.


def snapshot(ws: Workspace) -> tuple[dict, list[str]]:
    """The workspace's regular files (those `listdir` names) within its caps, as
    {"files": {path: base64}}, and what was left out and why (a file past a cap, one that
    changed kind or vanished while being read)."""
    lim = ws.limits
    files: dict[str, str] = {}
    left_out: list[str] = []
    total = 0
    try:
        names = ws.listdir(".")
    except ToolError as e:
        return {"files": files}, [str(e)]
    for rel in names:
        try:
            data = ws.read_bytes(rel)
        except ToolError as e:
            left_out.append(str(e))
            continue
        if total + len(data) > lim.max_total_bytes:
            left_out.append(f"{rel!r}: the workspace is over {lim.max_total_bytes} bytes")
        elif len(files) >= lim.max_files:
            left_out.append(f"{rel!r}: the workspace is over {lim.max_files} files")
        else:
            total += len(data)
            files[rel] = base64.b64encode(data).decode("ascii")
    return {"files": files}, left_out


def _decode_files(ws: Workspace, snap: Any, skipped: list[str] | None = None) -> dict[str, bytes]:
    """The snapshot's files, checked. With `skipped` (a list), a file that cannot be taken (a
    bad path, over a limit, a clash) is left out and its reason appended, instead of refusing
    the whole snapshot with a WireError."""
    files = field(snap, "files", dict, "workspace snapshot")
    lim = ws.limits

    def refuse(message: str) -> None:
        if skipped is None:
            raise WireError(f"workspace snapshot: {message}")
        skipped.append(message)

    out, total = {}, 0
    for rel, data in files.items():
        if len(out) >= lim.max_files:
            refuse(f"{len(files)} files is over the workspace limit of {lim.max_files}")
            break
        try:
            key = ws.key(rel)  # refuses '..', absolute paths, NUL, surrogates, long names
        except ToolError as e:
            refuse(str(e))
            continue
        if key != rel:
            refuse(f"path {rel!r} is not in canonical form ({key!r})")
            continue
        if not isinstance(data, str):
            refuse(f"file {rel!r} is not base64 text")
            continue
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            refuse(f"file {rel!r} is not valid base64")
            continue
        if len(raw) > lim.max_file_bytes or total + len(raw) > lim.max_total_bytes:
            refuse(f"over the workspace limits at {rel!r}")
            continue
        total += len(raw)
        out[rel] = raw
    dirs = {rel.rsplit("/", i)[0] for rel in out for i in range(1, rel.count("/") + 1)}
    for clash in [rel for rel in out if rel in dirs]:
        refuse(f"{clash!r} is both a file and a directory")
        del out[clash]
    return out


def restore(ws: Workspace, snap: Any, *, lenient: bool = False) -> list[str]:
    """Makes `ws` hold exactly the snapshot's regular files: everything else (other files,
    emptied directories, links, FIFOs) is removed, and anything in the way of one is replaced.
    A WireError names what is refused (a bad path, over the limits, a file that cannot be
    written); with `lenient` (the end of an episode, which is always graded) such files are
    left out instead and the reasons returned."""
    skipped: list[str] | None = [] if lenient else None
    files = _decode_files(ws, snap, skipped)
    try:
        ws.keep_only(files)
    except ToolError as e:
        raise WireError(f"workspace snapshot: {e}") from None
    for rel, raw in files.items():
        try:
            ws.write_bytes(rel, raw)
        except ToolError as e:
            if skipped is None:
                raise WireError(f"workspace snapshot: {e}") from None
            skipped.append(str(e))
    return skipped or []
