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

That is the native `Rendering`. A Hugging Face tokenizer that ships a chat template (the
Nemotron family) renders the same segments through its own markup instead
(`avalon/tokenizer/template.py`): each opening is the template's role header (e.g.
`<|im_start|>system\n`), `<|end|>` is the template's end-of-turn special (`<|im_end|>`), the
text the template puts between turns (`\n`) opens every prompt, and a call is the tokenizer's
`<tool_call>` ... `</tool_call>` when it has them. `Rendering` holds those id sequences; the
format's rules (openings only from the renderer, one stop id, calls split at one id, any other
control id in an output malformed) are the same for both.

Text calls (`Rendering.text_calls`), for a pretrained vocabulary without a `<tool_call>` token
(SmolLM2, Llama): a call is written in ordinary tokens, the way instruction-tuned models were
taught to call tools (Hermes, Qwen2.5, SmolLM2's function-calling data):

    FREE TEXT
    <tool_call>{"name": "hire", "arguments": {"title": "QA", "role": "test"}}</tool_call>

A new special id would be a row the pretrained model has never produced, so it could not call
a tool zero-shot; markers it can spell, it can. The output is decoded to text and split at the
marker strings (`split_output`); text between or after the calls is not part of any call, an
unclosed last call runs to the end of the output. The rules on control ids are unchanged: any
other special (or an `<|end|>` before the last token) makes the turn malformed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from avalon.tokenizer.base import Special, Tokenizer


@dataclasses.dataclass(frozen=True)
class Rendering:
    """The ids that lay out segments (see the module docstring)."""

    system_open: tuple[int, ...]  # opens the system segment
    obs_open: tuple[int, ...]  # opens an observation
    agent_open: tuple[int, ...]  # opens the agent's output (the model samples after it)
    end: int  # ends every segment; the engine's stop token
    call: int  # starts one tool call in an output
    call_close: tuple[int, ...] = ()  # ends one tool call (template markup), or nothing
    sep: tuple[int, ...] = ()  # between a segment's end and the next opening
    control: frozenset[int] = frozenset()  # ids an output may hold only as call / call_close
    # Calls spelt in text between these two strings (`call` is then unused: -1); None: one
    # call id. See the module docstring.
    text_calls: tuple[str, str] | None = None

    @classmethod
    def native(cls, special_ids) -> Rendering:
        """The project's own format over one id per `Special`."""
        missing = [s.name for s in Special if s not in special_ids]
        if missing:
            raise ValueError(f"ChatFormat: tokenizer has no id for specials {missing}")
        ids = dict(special_ids)
        return cls(system_open=(ids[Special.SYSTEM],), obs_open=(ids[Special.OBS],),
                   agent_open=(ids[Special.AGENT],), end=ids[Special.END],
                   call=ids[Special.CALL], control=frozenset(ids.values()))


@dataclasses.dataclass(frozen=True)
class OutputParts:
    """An agent output split at its special tokens."""

    text: str  # free text before the first call
    calls: tuple[str, ...]  # the decoded text of each call (after its `<|call|>`)
    ended: bool  # the output's last token is `<|end|>`
    error: str | None  # a structural problem (a stray special), else None


class ChatFormat:
    """Renders segments to ids and splits sampled outputs, for one tokenizer (and its
    `Rendering`: the native one unless given, e.g. `tok.rendering` of a templated tokenizer)."""

    def __init__(self, tok: Tokenizer, rendering: Rendering | None = None):
        self.tok = tok
        self.rendering = Rendering.native(tok.special_ids) if rendering is None else rendering
        self._ids = dict(tok.special_ids)
        r = self.rendering
        self._allowed = {r.call, *r.call_close}

    def id(self, special: Special) -> int:
        """The id of one special token."""
        return self._ids[special]

    @property
    def end_id(self) -> int:
        """The end of a turn: the engine's stop token for every turn."""
        return self.rendering.end

    def system(self, text: str) -> list[int]:
        """`<|system|>text<|end|>`."""
        r = self.rendering
        return [*r.system_open, *self.tok.encode(text), r.end]

    def turn_prompt(self, obs_text: str) -> list[int]:
        """`<|obs|>text<|end|><|agent|>`: an observation and the header the model answers."""
        r = self.rendering
        return [*r.sep, *r.obs_open, *self.tok.encode(obs_text), r.end, *r.sep, *r.agent_open]

    @property
    def json_calls(self) -> bool:
        """Calls are spelt in text as JSON objects (`Rendering.text_calls`), not after an id."""
        return self.rendering.text_calls is not None

    def output(self, text: str, calls: Sequence[str] = ()) -> list[int]:
        """An agent output as ids: `text<|call|>call ...<|end|>` (scripted policies use it);
        with text calls, `text` then each call on its own line between the markers."""
        r = self.rendering
        if r.text_calls is not None:
            opening, closing = r.text_calls
            lines = ([text] if text else []) + [f"{opening}{c}{closing}" for c in calls]
            return self.tok.encode("\n".join(lines)) + [r.end]
        ids = self.tok.encode(text)
        for call in calls:
            ids += [r.call, *self.tok.encode(call), *r.call_close]
        return ids + [r.end]

    def split_output(self, ids: Sequence[int] | np.ndarray) -> OutputParts:
        """Splits a sampled output at its calls; never raises (outputs are model-written)."""
        r = self.rendering
        ids = [int(i) for i in ids]
        ended = bool(ids) and ids[-1] == r.end
        body = ids[:-1] if ended else ids
        error = None
        for pos, i in enumerate(body):
            if (i in r.control or i == r.end) and i not in self._allowed:
                error = f"stray {self.tok.decode([i])} at output token {pos}"
                break
        if r.text_calls is not None:
            text, calls = split_text_calls(self.tok.decode(body), *r.text_calls)
            return OutputParts(text=text, calls=calls, ended=ended, error=error)
        chunks: list[list[int]] = [[]]
        for i in body:
            if i == r.call:
                chunks.append([])
            else:
                chunks[-1].append(i)
        close = list(r.call_close)
        calls = []
        for c in chunks[1:]:
            if close and c[-len(close):] == close:
                c = c[:-len(close)]
            calls.append(self.tok.decode([i for i in c if i not in r.call_close]))
        return OutputParts(text=self.tok.decode(chunks[0]), calls=tuple(calls), ended=ended,
                           error=error)


def split_text_calls(text: str, opening: str, closing: str) -> tuple[str, tuple[str, ...]]:
    """(free text before the first call, each call's text between the markers). A call
    without its closing marker runs to the end; text outside the calls is not kept."""
    first = text.find(opening)
    if first < 0:
        return text, ()
    calls, pos = [], first
    while pos >= 0:
        start = pos + len(opening)
        end = text.find(closing, start)
        nxt = text.find(opening, start)
        if end < 0 or (0 <= nxt < end):  # unclosed: up to the next opening, or the end
            stop = nxt if nxt >= 0 else len(text)
            calls.append(text[start:stop])
            pos = nxt
            continue
        calls.append(text[start:end])
        pos = text.find(opening, end + len(closing))
    return text[:first], tuple(calls)
