"""Checks a run report's review and verification measures against the environment's end
records it summed (`report["env_records"]`, read straight from the logs' `end` events by
`report_tables.record_totals`, not through `counts.py`)."""

from __future__ import annotations

import math


def _f(fields, key, part):
    return fields.get(key, {}).get(part, 0)


# measure -> (numerator, denominator) from one checkpoint's summed end records
RECORDED = {
    "teams_with_review": lambda f: (_f(f, "reviews", "teams_above_0"), _f(f, "reviews", "teams")),
    "reviews_per_team": lambda f: (_f(f, "reviews", "team_sum"), _f(f, "reviews", "teams")),
    "defects_found_per_team": lambda f: (_f(f, "defects_found", "team_sum"),
                                         _f(f, "defects_found", "teams")),
    "self_review_share": lambda f: (_f(f, "self_reviews", "team_sum"),
                                    _f(f, "reviews", "team_sum")
                                    + _f(f, "self_reviews", "team_sum")),
    "shipped_per_rollout": lambda f: (_f(f, "shipped", "sum"), _f(f, "shipped", "rollouts")),
    "shipped_defects_per_rollout": lambda f: (_f(f, "shipped_defects", "sum"),
                                              _f(f, "shipped_defects", "rollouts")),
    "shipped_defect_share": lambda f: (_f(f, "shipped_defects", "sum"), _f(f, "shipped", "sum")),
}


def disagreements(report: dict) -> list[str]:
    """Every checkpoint's review / verification measure that is not what the environment's
    end records give (empty: they agree); also each checkpoint with records that the report
    has no row for, and `reviewed_ship_share` whose denominator is not the ships recorded."""
    rows = {(c["phase"], c["step"], c["arm"]): c for c in report["checkpoints"]}
    out = []
    for rec in report["env_records"]:
        key = (rec["phase"], rec["step"], rec["arm"])
        c = rows.get(key)
        if c is None:
            out.append(f"{key}: no checkpoint")
            continue
        for name, parts in RECORDED.items():
            num, den = parts(rec["fields"])
            want = num / den if den else None
            got = c[name]["estimate"] if c[name] is not None else None
            if (got is None) != (want is None) or (
                    want is not None and not math.isclose(got, want, rel_tol=1e-12,
                                                          abs_tol=1e-12)):
                out.append(f"{key} {name}: report {got}, end records {want}")
        ships = c["reviewed_ship_share"]
        if ships is not None and ships["of"] != _f(rec["fields"], "shipped", "sum"):
            out.append(f"{key} reviewed_ship_share: of {ships['of']} ships, end records "
                       f"{_f(rec['fields'], 'shipped', 'sum')}")
    return out
