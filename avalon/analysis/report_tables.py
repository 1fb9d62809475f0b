"""Two of the run report's tables, straight from the logs: what the environment recorded at the
end of each rollout, and which tool calls failed.

- `env_records(rollouts)`: per checkpoint, the environment's end records (`end` events'
  `env_metrics`) summed as the environment wrote them, over every rollout and over the teams
  (a rollout with a `hire` event), with how many rollouts (teams) carried each field and how
  many teams had it above 0. These are the numbers the action-based review measures
  (`teams_with_review`, `reviews_per_team`, `shipped_per_rollout`, ...) divide, read here
  without going through `counts.py`, so a reader can check one against the other.
- `failed_calls(pairs)`: per checkpoint, arm, role and tool, the tool calls, the failed ones
  and the commonest error text (`RolloutMetrics.calls`, `call_errors`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from avalon.analysis.counts import RolloutMetrics
from avalon.org.events import EventKind

_END, _HIRE = EventKind.END.value, EventKind.HIRE.value


def record_totals(logs: Iterable[Sequence[Mapping]]) -> dict:
    """The environment's end records of `logs` (each a rollout's events), summed: `rollouts`,
    `teams`, and per field of `env_metrics`: `sum`, `rollouts` (that carried it),
    `team_sum`, `teams` (teams that carried it), `teams_above_0`."""
    out = {"rollouts": 0, "teams": 0, "fields": {}}
    for events in logs:
        end = next((e for e in reversed(events) if e["kind"] == _END), {})
        team = any(e["kind"] == _HIRE for e in events)
        out["rollouts"] += 1
        out["teams"] += team
        for key, v in (end.get("env_metrics") or {}).items():
            f = out["fields"].setdefault(key, {"sum": 0.0, "rollouts": 0, "team_sum": 0.0,
                                               "teams": 0, "teams_above_0": 0})
            f["sum"] += float(v)
            f["rollouts"] += 1
            if team:
                f["team_sum"] += float(v)
                f["teams"] += 1
                f["teams_above_0"] += float(v) > 0
    out["fields"] = dict(sorted(out["fields"].items()))
    return out


def env_records(groups: Mapping[tuple[str, int, str], Sequence[Sequence[Mapping]]],
                rl_steps: Mapping[tuple[str, int], int]) -> list[dict]:
    """`record_totals` per checkpoint: `groups` maps (phase, step, arm) to its rollouts'
    events; `rl_steps` (phase, step) to the RLCR step. Checkpoints without any end record are
    left out."""
    rows = []
    for (phase, step, arm), logs in sorted(groups.items()):
        totals = record_totals(logs)
        if totals["fields"]:
            rows.append({"phase": phase, "step": step, "rl_step": rl_steps[(phase, step)],
                         "arm": arm, **totals})
    return rows


def failed_calls(groups: Mapping[tuple[str, int, str], Sequence[RolloutMetrics]],
                 rl_steps: Mapping[tuple[str, int], int]) -> list[dict]:
    """Per checkpoint (phase, step, arm), role and tool: `calls`, `failed`, `share` (failed /
    calls) and `error` (the commonest error text of the tool's failed calls, any role's, with
    its count), tools
    that failed most first; rows of tools that never failed are kept (their share is 0)."""
    rows = []
    for (phase, step, arm), ms in sorted(groups.items()):
        calls: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
        errors: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for m in ms:
            for role, tools in m.calls.items():
                for tool, (n, bad) in tools.items():
                    calls[(role, tool)][0] += n
                    calls[(role, tool)][1] += bad
            for tool, texts in m.call_errors.items():
                errors[tool].update(texts)
        for (role, tool), (n, bad) in sorted(calls.items(), key=lambda kv: (-kv[1][1],
                                                                            kv[0])):
            common = errors[tool].most_common(1)
            rows.append({"phase": phase, "step": step, "rl_step": rl_steps[(phase, step)],
                         "arm": arm, "role": role, "tool": tool, "calls": n, "failed": bad,
                         "share": bad / n if n else None,
                         "error": common[0][0] if bad and common else None,
                         "error_count": common[0][1] if bad and common else 0})
    return rows
