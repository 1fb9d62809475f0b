"""What RLCR changed in a run: held-out evaluations compared, paired rollout by rollout.

    python -m experiments.bench.toy_gain runs/toyA [runs/toyB ...] [--first=STEP] [--last=STEP]

Reads the evaluation event logs (`WORKDIR/events/eval/step<N>/`, `avalon/analysis/logs.py`).
Evaluations at different steps replay the same held-out tasks with the same seeds, so each
rollout of the last evaluation is paired with the rollout of the first one that has the same
environment, arm, task and seed; org against single pairs the same task and seed index. For
each quantity: the two means, the difference, its paired standard error
(sd of the differences / sqrt(n)) and the difference in standard errors. Quantities, all
counted from the event logs:
- reward: the collective reward (the sum of reward events);
- messages_per_agent: messages sent (DMs and channel posts) / agents that ever acted;
- review_share (verification, org arm): the rollout has a review by a teammate (a `review`
  call that did not fail and did not say `own work`), the report's "teams with at least one
  review";
- result_messages (parallel subtasks, org arm): messages whose text holds a result code that the
  sender's solve calls returned, so a teammate could get an input it needed;
- hires.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

import numpy as np

from avalon.analysis.logs import read_run

_RESULT = re.compile(r"result (\d+)")


def _messages(events) -> list[dict]:
    return [e for e in events if e["kind"] == "send"]


def _agents(events) -> int:
    return max(1, len({e["agent"] for e in events if e["kind"] == "model_call"}))


def _reviewed(events) -> float:
    return float(any(e["kind"] == "tool_call" and e["tool"] == "review" and not e["error"]
                     and "own work" not in str(e["result"]) for e in events))


def _result_messages(events) -> float:
    """Messages carrying a result their sender's own solve calls returned."""
    mine = collections.defaultdict(set)
    n = 0
    for e in events:
        if e["kind"] == "tool_call" and e["tool"] == "solve" and not e["error"]:
            for m in _RESULT.finditer(str(e["result"])):
                mine[e["agent"]].add(m.group(1))
        elif e["kind"] == "send":
            words = set(re.findall(r"\b\d+\b", str(e.get("text", ""))))
            n += bool(words & mine[e["agent"]])
    return float(n)


def quantities(r) -> dict[str, float]:
    ev = r.events
    q = {"reward": r.reward, "messages_per_agent": len(_messages(ev)) / _agents(ev),
         "hires": float(sum(e["kind"] == "hire" for e in ev))}
    if r.env == "verification":
        q["review_share"] = _reviewed(ev)
    if r.env == "parallel":
        q["result_messages"] = _result_messages(ev)
    return q


def _paired(a: list[float], b: list[float]) -> dict:
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = b - a
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    diff = float(d.mean())
    return {"n": len(d), "first": float(a.mean()), "last": float(b.mean()), "diff": diff,
            "se": se, "z": diff / se if se > 0 else (0.0 if diff == 0 else float("inf"))}


def compare(workdir: str, first: int | None = None, last: int | None = None) -> dict:
    by_step = collections.defaultdict(dict)
    for r in read_run(workdir, phase="eval"):
        if r.arm not in ("org", "single"):
            continue
        key = (r.env, r.arm, r.task_id, int(r.extra.get("seed_index", 0)))
        by_step[r.step][key] = quantities(r)
    if len(by_step) < 2:
        raise SystemExit(f"toy_gain: {workdir} has {len(by_step)} evaluation(s); needs 2")
    steps = sorted(by_step)
    s0 = first if first is not None else steps[0]
    s1 = last if last is not None else steps[-1]
    for s in (s0, s1):
        if s not in by_step:
            raise SystemExit(f"toy_gain: {workdir} has no evaluation at step {s}; has {steps}")
    A, B = by_step[s0], by_step[s1]
    out = {"workdir": workdir, "first_step": s0, "last_step": s1, "rise": {}, "org_vs_single": {}}
    for arm in ("org", "single"):
        for scope in ("all", "parallel", "hidden_profile", "verification"):
            keys = [k for k in A if k in B and k[1] == arm and scope in ("all", k[0])]
            if not keys:
                continue
            for name in sorted({n for k in keys for n in A[k]}):
                ks = [k for k in keys if name in A[k] and name in B[k]]
                if ks:
                    out["rise"][f"{arm}/{scope}/{name}"] = _paired([A[k][name] for k in ks],
                                                                   [B[k][name] for k in ks])
    for step, label in ((s0, "first"), (s1, "last")):
        cur = by_step[step]
        pairs = [(k, (k[0], "single", k[2], k[3])) for k in cur if k[1] == "org"]
        pairs = [(o, s) for o, s in pairs if s in cur]
        out["org_vs_single"][label] = None if not pairs else _paired(
            [cur[s]["reward"] for _, s in pairs], [cur[o]["reward"] for o, _ in pairs])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--first", type=int, default=None)
    p.add_argument("--last", type=int, default=None)
    args = p.parse_args()
    print(json.dumps([compare(w, args.first, args.last) for w in args.runs], indent=1))


if __name__ == "__main__":
    main()
