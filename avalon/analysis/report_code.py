"""Which code a run ran, for its report: read from the run directory's record of its starts.

The training loop appends an entry to `RUN_DIR/config_history.jsonl` at every start of a run
(the first and each resume) with `code`: `{"commit": SHA, "dirty": bool}`, or
`{"commit": null, "why": ...}` where the code had no git checkout to ask (an installed
package); `summary.json` holds the last invocation's. `run_code` turns that into the phrase the
report says after "at": `commit 9f91d94c1a2b`, `commit 9f91d94c1a2b with uncommitted changes`,
`commit A from step 0, then commit B from step 600`, or `an unrecorded commit (why)`.
"""

from __future__ import annotations

import json
import os

HISTORY_FILE = "config_history.jsonl"  # written by avalon/train/config_history.py
UNRECORDED = "an unrecorded commit"


def _phrase(code: dict) -> str:
    if not code.get("commit"):
        why = code.get("why")
        return f"{UNRECORDED} ({why})" if why else UNRECORDED
    dirty = " with uncommitted changes" if code.get("dirty") else ""
    return f"commit {code['commit'][:12]}{dirty}"


def _starts(run_dir: str) -> list[tuple[int, dict]]:
    """(step, code) of every recorded start, in order (lines cut by a kill are skipped)."""
    path = os.path.join(run_dir, HISTORY_FILE)
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("code"), dict) \
                    and entry["code"]:
                out.append((int(entry.get("step", 0)), entry["code"]))
    return out


def run_code(run_dir: str, summary: dict) -> tuple[str, str]:
    """(the phrase for the code the run ran, its commit text or '' when none is known)."""
    starts = _starts(run_dir)
    if not starts and isinstance(summary.get("code"), dict):
        starts = [(int(summary.get("resumed_at_step") or 0), summary["code"])]
    if not starts:
        commit = summary.get("commit", "")
        return (f"commit {commit}" if commit else UNRECORDED), commit
    spans: list[tuple[int, str]] = []  # (first step, phrase), one per change of code
    for step, code in starts:
        if not spans or spans[-1][1] != _phrase(code):
            spans.append((step, _phrase(code)))
    if len(spans) == 1:
        phrase = spans[0][1]
    else:
        phrase = ", then ".join(f"{p} from step {s}" for s, p in spans)
    commit = phrase.removeprefix("commit ") if len(spans) == 1 and starts[-1][1].get(
        "commit") else ""
    return phrase, commit
