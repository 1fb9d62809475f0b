"""JSON forms of the environment protocol's values, shared by the HTTP server and client.

Tools travel as `{"name", "description", "grantable", "parameters"}` with `parameters` the
tool's JSON schema (`ToolSpec.json_schema()`); the client rebuilds `ToolSpec`s from it (schema
properties keep their order in JSON objects). Decoders check every field and raise `WireError`
naming the field and the value, never a KeyError deep inside.

Workspaces: an environment with `uses_workspace` reads the rollout's workspace, which lives on
the client. The client sends a snapshot `{"files": {path: base64}}` with each call and with the
end; the server writes it into the session's own directory before calling the real session.
A snapshot holds only the regular files within the workspace's limits (`snapshot` also says
what it left out: symlinks, FIFOs, bad names, files past a cap); `restore` refuses bad paths
and snapshots over the limits with a `WireError`. Both work beneath the root without following
any symlink (see the section below), so what sandboxed code leaves behind cannot redirect them.
Changes an environment makes (a layout in `on_start`, files in a call) come back in the reply.
"""

from __future__ import annotations

import base64
import errno
import math
import os
import stat
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


# ----- workspace snapshots -----
# Files are read and written beneath the workspace root through directory descriptors opened
# with O_NOFOLLOW, one component at a time: a symlink anywhere in a path (one that sandboxed
# code may flip while we work, e.g. to /proc/self/cwd) is never followed, only skipped or
# removed. Only regular files travel; FIFOs and sockets are opened non-blocking and skipped.

MAX_PATH_PARTS = 64
MAX_PATH_BYTES = 4096
_NAME_MAX = 255
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def path_parts(rel: Any) -> tuple[str, ...]:
    """The components of a snapshot path (canonical: 'a/b.py'), or a WireError saying why not."""
    if not isinstance(rel, str) or not rel:
        raise WireError(f"workspace snapshot: path {rel!r} must be a non-empty string")
    if "\x00" in rel:
        raise WireError(f"workspace snapshot: path {rel!r} contains a NUL byte")
    if rel.startswith("/"):
        raise WireError(f"workspace snapshot: path {rel!r} is absolute")
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        raise WireError(f"workspace snapshot: path {rel!r} is not valid UTF-8 text") from None
    parts = tuple(rel.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise WireError(f"workspace snapshot: path {rel!r} has an empty, '.' or '..' part")
    if size > MAX_PATH_BYTES or len(parts) > MAX_PATH_PARTS:
        raise WireError(f"workspace snapshot: path {rel[:60]!r}... is over {MAX_PATH_BYTES} "
                        f"bytes or {MAX_PATH_PARTS} parts")
    if any(len(p.encode("utf-8")) > _NAME_MAX for p in parts):
        raise WireError(f"workspace snapshot: path {rel[:60]!r} has a part over {_NAME_MAX} "
                        "bytes")
    return parts


def _open_dir(root_fd: int, parts: tuple[str, ...], create: bool = False) -> int:
    """A descriptor of directory `parts` beneath `root_fd`, no symlink followed (OSError)."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            sub = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def _entries(root_fd: int):
    """(parts, is_dir) of everything beneath the root, each directory's entries sorted,
    iteratively (no recursion, no links followed, nothing deeper than MAX_PATH_PARTS)."""
    stack: list[tuple[str, ...]] = [()]
    while stack:
        prefix = stack.pop()
        try:
            fd = _open_dir(root_fd, prefix)
        except OSError:
            continue  # raced away or turned into a link: nothing of ours is there
        try:
            with os.scandir(fd) as it:
                found = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        finally:
            os.close(fd)
        found.sort()
        for name, is_dir in found:
            yield (*prefix, name), is_dir
        stack.extend((*prefix, name) for name, is_dir in reversed(found)
                     if is_dir and len(prefix) + 1 < MAX_PATH_PARTS)


def _read_regular(root_fd: int, parts: tuple[str, ...], limit: int) -> bytes | str:
    """The file's bytes (at most limit + 1 of them), or why it is not a regular file."""
    try:
        dfd = _open_dir(root_fd, parts[:-1])
    except OSError as e:
        return f"its directory cannot be opened ({e.strerror})"
    try:
        fd = os.open(parts[-1], _READ, dir_fd=dfd)
    except OSError as e:
        return "a symlink" if e.errno == errno.ELOOP else f"unreadable ({e.strerror})"
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        return f.read(limit + 1)


def snapshot(ws: Workspace) -> tuple[dict, list[str]]:
    """The workspace's regular files that fit its limits, as {"files": {path: base64}}, and
    what was left out and why (symlinks, FIFOs, bad names, files past a limit)."""
    lim = ws.limits
    files, left_out, total = {}, [], 0
    root_fd = os.open(ws.root, _DIR)
    try:
        for parts, is_dir in _entries(root_fd):
            rel = "/".join(parts)
            if is_dir:
                if len(parts) >= MAX_PATH_PARTS:
                    left_out.append(f"{rel[:60]!r}: nested over {MAX_PATH_PARTS} levels")
                continue
            try:
                path_parts(rel)
            except WireError as e:
                left_out.append(str(e).removeprefix("workspace snapshot: "))
                continue
            data = _read_regular(root_fd, parts, lim.max_file_bytes)
            if isinstance(data, str):
                left_out.append(f"{rel!r}: {data}")
            elif len(data) > lim.max_file_bytes:
                left_out.append(f"{rel!r}: over {lim.max_file_bytes} bytes")
            elif total + len(data) > lim.max_total_bytes:
                left_out.append(f"{rel!r}: the workspace is over {lim.max_total_bytes} bytes")
            elif len(files) >= lim.max_files:
                left_out.append(f"{rel!r}: the workspace is over {lim.max_files} files")
            else:
                total += len(data)
                files[rel] = base64.b64encode(data).decode("ascii")
    finally:
        os.close(root_fd)
    return {"files": files}, left_out


def _decode_files(ws: Workspace, snap: Any) -> dict[tuple[str, ...], bytes]:
    files = field(snap, "files", dict, "workspace snapshot")
    lim = ws.limits
    if len(files) > lim.max_files:
        raise WireError(f"workspace snapshot: {len(files)} files is over the workspace limit "
                        f"of {lim.max_files}")
    out, total = {}, 0
    for rel, data in files.items():
        parts = path_parts(rel)
        if not isinstance(data, str):
            raise WireError(f"workspace snapshot: file {rel!r} is not base64 text")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise WireError(f"workspace snapshot: file {rel!r} is not valid base64") from None
        total += len(raw)
        if len(raw) > lim.max_file_bytes or total > lim.max_total_bytes:
            raise WireError(f"workspace snapshot: over the workspace limits at {rel!r}")
        out[parts] = raw
    dirs = {parts[:i] for parts in out for i in range(1, len(parts))}
    clash = next((p for p in out if p in dirs), None)
    if clash is not None:
        raise WireError(f"workspace snapshot: {'/'.join(clash)!r} is both a file and a "
                        "directory")
    return out


def _write(root_fd: int, parts: tuple[str, ...], raw: bytes) -> None:
    dfd = _open_dir(root_fd, parts[:-1], create=True)
    try:
        name = parts[-1]
        try:
            fd = os.open(name, _WRITE, 0o644, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            fd = None
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            fd = None
        if fd is None:  # a symlink, FIFO, socket or empty directory is in the way: replace it
            try:
                os.unlink(name, dir_fd=dfd)
            except IsADirectoryError:
                os.rmdir(name, dir_fd=dfd)
            fd = os.open(name, _WRITE | os.O_EXCL, 0o644, dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    finally:
        os.close(dfd)


def restore(ws: Workspace, snap: Any) -> None:
    """Makes `ws` hold exactly the snapshot's regular files (anything else that is not a
    directory is removed); a WireError names what is refused (a bad path, over the limits)."""
    files = _decode_files(ws, snap)
    root_fd = os.open(ws.root, _DIR)
    try:
        stale = [parts for parts, is_dir in _entries(root_fd)
                 if not is_dir and parts not in files]
        for parts in stale:
            try:
                dfd = _open_dir(root_fd, parts[:-1])
            except OSError:
                continue  # its directory is gone or is a link now: nothing of ours to remove
            try:
                os.unlink(parts[-1], dir_fd=dfd)
            except FileNotFoundError:
                pass
            finally:
                os.close(dfd)
        for parts, raw in files.items():
            try:
                _write(root_fd, parts, raw)
            except OSError as e:
                raise WireError(f"workspace snapshot: cannot write {'/'.join(parts)!r} "
                                f"({e.strerror})") from None
    finally:
        os.close(root_fd)
