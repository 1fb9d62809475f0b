"""Job-title classes (SPEC §5: the share of hires titled "lead", reviewers, verifiers, builders).

A title belongs to every class one of whose patterns it matches (case-insensitive regular
expressions searched anywhere in the title), so "QA / Verifier" is a reviewer and a verifier and
"Lead Engineer" is a lead and a builder. The rules are data: pass your own `TitleRules` to
classify differently (the report's own classifier is not public).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

LEAD, REVIEWER, VERIFIER, BUILDER = "lead", "reviewer", "verifier", "builder"

DEFAULT_PATTERNS: Mapping[str, Sequence[str]] = {
    LEAD: (r"\blead",),  # the report counts titles with "lead" in them
    REVIEWER: (r"review", r"\bcritic", r"\bauditor", r"\bqa\b", r"quality"),
    VERIFIER: (r"verif", r"validat", r"\btest", r"\bqa\b", r"\bcheck"),
    BUILDER: (r"engineer", r"develop", r"build", r"implement", r"\bcoder?\b", r"programm",
              r"\bsolver?\b", r"\bworker\b", r"analyst", r"architect"),
}


@dataclasses.dataclass(frozen=True)
class TitleRules:
    patterns: Mapping[str, Sequence[str]] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_PATTERNS))

    def __post_init__(self):
        for cls, pats in self.patterns.items():
            for p in pats:
                try:
                    re.compile(p)
                except re.error as e:
                    raise ValueError(f"TitleRules: class {cls!r} pattern {p!r}: {e}") from None

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.patterns)

    def classify(self, title: str) -> frozenset[str]:
        """Every class `title` belongs to (possibly none)."""
        return frozenset(cls for cls, pats in self.patterns.items()
                         if any(re.search(p, title, re.IGNORECASE) for p in pats))


DEFAULT_TITLE_RULES = TitleRules()
