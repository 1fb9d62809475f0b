"""The words of the organisation's own texts, for toy presets' word-level tokenizers.

    tok = WordTokenizer(org_vocabulary() + env_words)   # check tok.vocab_size <= model vocab

Everything the simulator itself writes into a context (tool names and arguments, role-card
labels, notices, result and error phrases) uses these words, so with them in the word list a
toy transcript spends one token per word, not one per character.
"""

from __future__ import annotations

import re

from avalon.org.channels import Subscription
from avalon.org.config import PromptStyle
from avalon.org.prompts import (
    CEO_ROLE,
    role_card,
    start_text,
    stub,
    summary_request,
    summary_restart,
)
from avalon.org.tools import SPECS

_WORD = re.compile(r"[A-Za-z0-9_]{2,}")
# Phrases of tool results and notices (handlers.py, organisation.py), without their variables.
_PHRASES = (
    "hired fired created sent reacted saved wrote bytes waiting done empty channel message",
    "error malformed turn call calls no tool not one of your tools unknown argument missing",
    "must be string integer number boolean array object got plan mode is refused in first",
    "budget hires left the CEO cannot be fired active agent that is you evidence seq file",
    "archive successful such note path exit timed out stderr output truncated result cut",
    "observation cut read_message re any reacted to dm report status blocked next trace",
    "tokens of wall clock task has ended run yours",
    "a1 a2 a3 a4 a5 a6 a7 a8",  # agent ids up to the largest budget trained (8)
)


def org_vocabulary() -> list[str]:
    """Words (runs of [A-Za-z0-9_], length >= 2) of the organisation's texts, first-seen order."""
    specs = list(SPECS.values())
    texts = [
        CEO_ROLE,
        role_card(agent="ceo", title="CEO", role="", task="", brief="x", roster=[("ceo", "CEO")],
                  subscriptions=[("x", s.value) for s in Subscription], budget_left=0,
                  commitments="x", tools=specs, style=PromptStyle.FULL),
        *(p.name for s in specs for p in s.params),
        start_text(ceo=True, budget=0, plan_mode=True, hirer=None),
        start_text(ceo=False, budget=0, plan_mode=False, hirer="ceo"),
        summary_request(0), summary_restart("", ""), stub(0), *_PHRASES,
    ]
    return list(dict.fromkeys(w for t in texts for w in _WORD.findall(t)))
