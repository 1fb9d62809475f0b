"""The one chat format: how the organisation simulator lays out an agent's context in tokens.

An agent's context is a sequence of segments, each opened by a role marker and closed by
`<|end|>` (the specials are declared once, in `avalon.tokenizer.base.Special`):

    <|system|>ROLE CARD, ROSTER, TOOLS<|end|>
    <|obs|>TOOL RESULTS AND DELIVERED MESSAGES<|end|><|agent|>FREE TEXT<|call|>NAME {JSON}<|end|>
    <|obs|>...<|end|><|agent|>...<|end|>

A turn's prompt is `<|obs|>text<|end|><|agent|>` (4 fixed tokens with the output's `<|end|>`);
the model samples the agent's output after `<|agent|>` and the engine stops at `<|end|>`. The
output is free text, then zero or more tool calls, each `<|call|>` followed by the call text
(`avalon/org/toolcall.py` documents the call grammar: a tool name and an optional JSON object).
For example, with the call text spelt out:

    <|agent|>Hiring a tester first.<|call|>hire {"title":"QA","role":"test","tools":[]}<|end|>

Role markers are special ids, never text: message content cannot open a segment. In an
output, `<|call|>` is the only special allowed before the final `<|end|>`; any other special
(or an `<|end|>` before the last token) makes the turn malformed (`OutputParts.error`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from avalon.tokenizer.base import Special, Tokenizer


@dataclasses.dataclass(frozen=True)
class OutputParts:
    """An agent output split at its special tokens."""

    text: str  # free text before the first call
    calls: tuple[str, ...]  # the decoded text of each call (after its `<|call|>`)
    ended: bool  # the output's last token is `<|end|>`
    error: str | None  # a structural problem (a stray special), else None


class ChatFormat:
    """Renders segments to ids and splits sampled outputs, for one tokenizer."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self._ids = dict(tok.special_ids)
        missing = [s.name for s in Special if s not in self._ids]
        if missing:
            raise ValueError(f"ChatFormat: tokenizer has no id for specials {missing}")
        self._by_id = {i: s for s, i in self._ids.items()}

    def id(self, special: Special) -> int:
        """The id of one special token."""
        return self._ids[special]

    @property
    def end_id(self) -> int:
        """`<|end|>`: the engine's stop token for every turn."""
        return self._ids[Special.END]

    def system(self, text: str) -> list[int]:
        """`<|system|>text<|end|>`."""
        return [self._ids[Special.SYSTEM], *self.tok.encode(text), self._ids[Special.END]]

    def turn_prompt(self, obs_text: str) -> list[int]:
        """`<|obs|>text<|end|><|agent|>`: an observation and the header the model answers."""
        return [self._ids[Special.OBS], *self.tok.encode(obs_text), self._ids[Special.END],
                self._ids[Special.AGENT]]

    def output(self, text: str, calls: Sequence[str] = ()) -> list[int]:
        """An agent output as ids: `text<|call|>call ...<|end|>` (scripted policies use it)."""
        ids = self.tok.encode(text)
        for call in calls:
            ids += [self._ids[Special.CALL], *self.tok.encode(call)]
        return ids + [self._ids[Special.END]]

    def split_output(self, ids: Sequence[int] | np.ndarray) -> OutputParts:
        """Splits a sampled output at `<|call|>`; never raises (outputs are model-written)."""
        ids = [int(i) for i in ids]
        end = self._ids[Special.END]
        ended = bool(ids) and ids[-1] == end
        body = ids[:-1] if ended else ids
        call = self._ids[Special.CALL]
        error = None
        for pos, i in enumerate(body):
            special = self._by_id.get(i)
            if special is not None and special is not Special.CALL:
                error = f"stray {special.value} at output token {pos}"
                break
        chunks: list[list[int]] = [[]]
        for i in body:
            if i == call:
                chunks.append([])
            else:
                chunks[-1].append(i)
        return OutputParts(text=self.tok.decode(chunks[0]),
                           calls=tuple(self.tok.decode(c) for c in chunks[1:]),
                           ended=ended, error=error)
