"""A resumed run keeps the config it started with, or says what changed and keeps the record.

`WORKDIR/config.json` is the resolved config a run trains with (`config.describe`). When the
workdir already holds a checkpoint, `check_resume` compares the new config with it field by
field: a difference outside `RESUME_FIELDS` (the fields a resume is meant to change: more
steps, how often to evaluate, checkpoint and log) is refused with every differing field named,
because the steps already taken ran with the old values and `config.json` would no longer say
so. With `allow_change=True` the change goes ahead and is appended to
`WORKDIR/config_history.jsonl`: the step it took effect at, each changed field's old and new
value, and the whole config it replaced. Changes within `RESUME_FIELDS` are recorded too.
Every start of the run (the first and each resume) appends an entry, changed or not, with the
code it runs (`code_version`: the git commit and whether the checkout had uncommitted
changes), so the record says which code computed which steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from avalon import paths

HISTORY_FILE = "config_history.jsonl"

# Dotted fields (or sections, ending in ".") a resume may change without
# `--config.allow_config_change`: they decide how long the run goes on and what it records, not
# what the steps already taken computed. The mesh may differ too (a preempted pod job back on
# another slice shape): sharding changes where the arrays live, not the arithmetic's meaning.
RESUME_FIELDS = ("rollout.steps", "eval.every", "eval.log_events", "checkpoint.every",
                 "checkpoint.keep", "rollout.log_every", "keep_event_logs", "plots", "mesh.")


def flatten(config: Mapping, prefix: str = "") -> dict[str, object]:
    """{"a.b.c": value} for every leaf of a nested dict (lists kept whole)."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def differences(old: Mapping, new: Mapping) -> dict[str, tuple[object, object]]:
    """{field: (old, new)} for every field whose value differs (missing on one side: None)."""
    a, b = flatten(old), flatten(new)
    missing = object()
    out = {}
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, missing), b.get(key, missing)
        if json.dumps(x, sort_keys=True, default=str) != json.dumps(y, sort_keys=True,
                                                                    default=str):
            out[key] = (None if x is missing else x, None if y is missing else y)
    return out


def meant_for_resume(field: str) -> bool:
    return any(field == f or (f.endswith(".") and field.startswith(f)) for f in RESUME_FIELDS)


def has_checkpoint(workdir: str) -> bool:
    ckpt = paths.join(workdir, "checkpoints")
    return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def check_resume(workdir: str, new: Mapping, *, allow_change: bool) -> dict:
    """Refuse (ValueError naming every field) or record a changed config on resume; returns
    the differences ({} for a fresh workdir or the same config)."""
    previous = paths.join(workdir, "config.json")
    if not has_checkpoint(workdir) or not previous.exists():
        return {}
    old = json.loads(previous.read_text())
    new = json.loads(json.dumps(new, default=str))  # as config.json will hold it
    diff = differences(old, new)
    if not diff:
        return {}
    refused = {k: v for k, v in diff.items() if not meant_for_resume(k)}
    if refused and not allow_change:
        shown = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in refused.items())
        raise ValueError(
            f"{workdir} was trained with another config ({len(refused)} field"
            f"{'s' * (len(refused) > 1)} differ: {shown}); resume with the same config, use "
            "another --workdir, or pass --config.allow_config_change to go on with the change "
            f"(recorded in {HISTORY_FILE})")
    return diff


def record(workdir: str, step: int, diff: Mapping, previous: Mapping | None,
           command: tuple[str, ...] = (), code: Mapping | None = None) -> None:
    """Append one start of the run to WORKDIR/config_history.jsonl: its config changes ({}
    for none) and the code it runs (`code_version`)."""
    entry = {"step": int(step), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "changed": {k: {"old": a, "new": b} for k, (a, b) in diff.items()},
             "command": list(command), "previous": previous, "code": dict(code or {})}
    paths.append_text(paths.join(workdir, HISTORY_FILE),
                      json.dumps(entry, sort_keys=True, default=str) + "\n")


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."
