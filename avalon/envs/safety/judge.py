"""The "considered" judge until the laboratory's (avalon/analysis/judges.py) replaces it.

`rule_judge(text, phrases)` says whether an agent's text mentions any of the phrases (the
scenario's data: `Scenario.escalation_words`, `Scenario.harm_words`), case-insensitively, each
phrase starting at a word boundary ("alert" matches "alerting", not "palert"). Counting code
takes the judge as an argument, so an LLM judge with the same signature can stand in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

Judge = Callable[[str, Sequence[str]], bool]


def rule_judge(text: str, phrases: Sequence[str]) -> bool:
    low = text.lower()
    return any(re.search(r"\b" + re.escape(p.lower()), low) for p in phrases)
