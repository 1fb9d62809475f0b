"""What a run learnt, in one paragraph generated from its report (docs/running.md quotes one).

`paragraph(report)` reads the report's `shifts` (the organisation arm, first against last
evaluation, paired by task and seed) and its last org-against-single comparison, and says each
number with its shift in standard errors; nothing in it is typed by hand. A shift is called
real at 3 SE or more (`REAL_Z`). Written by the report as RUN_DIR/report/learning.md.

Reviews are said in two kinds, never mixed: the reviews the environment ran (its end record:
`teams_with_review`, `reviews_per_team`, ...) and the messages that read as reviews
(`teams_with_review_message`, ... , labelled by the report's judge). Where the environment
recorded no review, the paragraph says so and calls the messages words, not reviews; where it
keeps no record of reviews, it says that no review is known to have run.
"""

from __future__ import annotations

REAL_Z = 3.0
_PERCENT = ("teams_with_review", "self_review_share", "reviewed_ship_share",
            "shipped_defect_share", "teams_with_review_message", "review_message_precision",
            "review_message_recall", "rubber_stamp_share", "teams_with_help_offer",
            "lead_title_share", "reviewer_title_share", "verifier_title_share",
            "coordination_time_share", "failed_call_share")
_NAMES = {
    "reward": "held-out reward",
    "teams_with_review": "teams with a review",
    "reviews_per_team": "reviews per team",
    "defects_found_per_team": "defects found per team",
    "reviewed_ship_share": "shipped builds a teammate reviewed first",
    "shipped_defects_per_rollout": "shipped defects per rollout",
    "teams_with_review_message": "teams with a review message",
    "review_messages_per_team": "review messages per team",
    "review_message_precision": "review-message precision",
    "review_message_recall": "review-message recall",
    "rubber_stamps_per_team": "rubber stamps (approvals of a defective build) per team",
    "hires_per_rollout": "hires per rollout",
    "messages_per_agent": "messages per agent",
    "verifier_title_share": "verifier titles",
    "coordination_time_share": "co-ordination share of working time",
    "failed_calls_per_rollout": "failed tool calls per rollout",
    "failed_call_share": "failed share of tool calls",
}


def _number(name: str, v: float) -> str:
    if name not in _PERCENT:
        return f"{v:.2f}"
    # one decimal below 10%, so a small share keeps its digits (1.7%, not 2%)
    return f"{100 * v:.1f}%" if abs(v) < 0.1 else f"{100 * v:.0f}%"


def describe(row: dict) -> str:
    """`0.35 -> 1.54 (+6.9 SE)`, `n/a`, or without an SE `0.35 -> 1.54`."""
    name = row["measure"]
    if row.get("first") is None or row.get("last") is None:
        return "n/a"
    text = f"{_number(name, row['first'])} -> {_number(name, row['last'])}"
    if row.get("z") is not None:
        text += f" ({row['z']:+.1f} SE)"
    elif row.get("diff") == 0:
        text += " (no change)"
    return text


def _reviews(rows: dict, shifts: dict, judge: str, said) -> list[str]:
    """The sentences on reviews: those the environment ran (its end record), then the
    messages that read as reviews, which are never called reviews."""
    out = []
    ran = rows.get("teams_with_review") or {}
    first, last = ran.get("first"), ran.get("last")
    done = said(("teams_with_review", "reviews_per_team", "defects_found_per_team",
                 "reviewed_ship_share", "shipped_defects_per_rollout"))
    if first is not None and last is not None:
        out.append(f"Reviews the environment ran (its end record): {done}.")
        steps = (f"RL step {shifts['first_rl_step']} or {shifts['last_rl_step']}"
                 if first == 0 else f"RL step {shifts['last_rl_step']}")
        if last == 0:
            out.append(f"No review succeeded at {steps} (the environment recorded 0 reviews "
                       "in every team): there the organisation does not review.")
    words = said(("teams_with_review_message", "review_messages_per_team"))
    verdicts = said(("review_message_precision", "review_message_recall",
                     "rubber_stamps_per_team"))
    if words or verdicts:
        if first is None or last is None:
            why = ("no record of reviews by the environment at both evaluations, so none is "
                   "known to have run; ")
        elif last == 0:
            why = (f"at RL step {shifts['last_rl_step']} words only, no review ran behind "
                   "them; ")
        else:
            why = ""
        text = f"Messages that read as reviews ({why}labelled by {judge}): {words or 'n/a'}"
        if verdicts:
            text += (f"; their verdicts against the environment's ground truth: {verdicts}")
        out.append(text + ".")
    return out


def paragraph(report: dict) -> str:
    """The learning paragraph of a report (see the module docstring)."""
    shifts = report.get("shifts")
    org = (shifts or {}).get("arms", {}).get("org")
    if not org:
        return ("No learning paragraph: the run has fewer than two evaluations with an "
                "organisation arm.")
    rows = {r["measure"]: r for r in org["rows"]}
    commit = report.get("commit")
    code = report.get("code") or (f"commit {commit}" if commit else "an unrecorded commit")
    run = report["run"].rstrip("/").rsplit("/", 1)[-1]
    parts = [f"Run `{run}` at {code} (`python -m avalon.analyze`, "
             f"{org['pairs']} held-out organisation rollouts paired by task and seed between "
             f"RL step {shifts['first_rl_step']} and {shifts['last_rl_step']}): "
             f"{_NAMES['reward']} {describe(rows['reward'])}"]
    last = next((c for c in reversed(report["comparisons"]) if c.get("paired")), None)
    if last is not None:
        p = last["paired"]
        z = f", {p['z']:.1f} SE" if p.get("z") is not None else ""
        parts[-1] += (f"; at RL step {last['rl_step']} the organisation scores "
                      f"{p['diff']:+.2f} against the single agent on the same tasks{z}")
    parts[-1] += "."

    def said(names):
        return "; ".join(f"{_NAMES.get(n, n)} {describe(rows[n])}" for n in names
                         if n in rows and describe(rows[n]) != "n/a")

    parts += _reviews(rows, shifts, report.get("judge") or "the rule judge", said)
    team = said(("hires_per_rollout", "messages_per_agent", "verifier_title_share",
                 "coordination_time_share", "failed_calls_per_rollout", "failed_call_share"))
    if team:
        parts.append(f"The team: {team}.")
    real = [n for n, r in rows.items() if r.get("z") is not None and abs(r["z"]) >= REAL_Z]
    parts.append(f"Shifts of {REAL_Z:g} SE or more: "
                 f"{', '.join(_NAMES.get(n, n) for n in real) if real else 'none'}; "
                 "every other shift above is within noise.")
    return " ".join(parts)
