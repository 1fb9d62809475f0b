"""Text shown to an agent never encodes a control token of the vocabulary.

Messages, titles, roles, tool results and file contents reach other agents' contexts as text
that the tokenizer encodes. Special tokens in text stay text (`HFTokenizer.encode`), but a
vocabulary may also ship non-special added tokens that mean structure: Qwen's `<tool_call>` is
one, and where the chat format uses it as `<|call|>`, a message holding the string would put
the real call id into a teammate's observation. So every system prompt and observation the
organisation renders goes through `PlainTextChat`, which checks that the text added no control
id to the rendering's own (`control_ids`: the rendering's markup and specials, and every token
the vocabulary adds, special or not) and otherwise rewrites the text (`defuse`): each
offending token's string gets a space after its first character (`<tool_call>` is shown as
`< tool_call>`; a one-character token becomes U+FFFD); text that still encodes one after that
(a normaliser that composes it) is NFKC-normalised and tried again, and as a last resort
replaced by a note. Text that encodes no control token (every text under the byte and word
tokenizers) is rendered unchanged: the check costs one encode.
"""

from __future__ import annotations

import unicodedata
import weakref

MAX_ROUNDS = 8
WITHHELD = "(text withheld: it encodes the vocabulary's control tokens)"


def control_ids(chat) -> frozenset[int]:
    """The ids that only the renderer may place: the rendering's markup and specials, and
    every token the vocabulary adds (`added_token_ids` of a Hugging Face tokenizer)."""
    r = chat.rendering
    ids = set(r.control) | {r.end, r.call, *r.call_close} | set(chat.tok.special_ids.values())
    ids |= set(getattr(chat.tok, "added_token_ids", ()))
    return frozenset(ids)


def defuse(tok, text: str, control: frozenset[int]) -> str:
    """`text` rewritten so that `tok.encode` gives no id in `control` (module docstring)."""
    for _ in range(MAX_ROUNDS):
        bad = sorted({i for i in tok.encode(text) if i in control})
        if not bad:
            return text
        changed = False
        for i in bad:
            s = tok.decode([i])
            if s and s in text:
                text = text.replace(s, s[0] + " " + s[1:] if len(s) > 1 else "\ufffd")
                changed = True
        if not changed:
            normal = unicodedata.normalize("NFKC", text)
            if normal == text:
                break
            text = normal
    return text if not {i for i in tok.encode(text) if i in control} else WITHHELD


class PlainTextChat:
    """A `ChatFormat` whose `system` and `turn_prompt` render only plain text (module
    docstring); everything else is the wrapped format's (`plain_chat` makes one per format)."""

    def __init__(self, chat):
        self._chat = chat
        self._control = control_ids(chat)
        # The renderer's own control ids around an empty text: what any rendering must hold.
        self._frame = {"system": self._count(chat.system("")),
                       "turn_prompt": self._count(chat.turn_prompt(""))}
        # What the organisation reads on every turn, without __getattr__'s detour.
        self.tok, self.rendering, self.end_id = chat.tok, chat.rendering, chat.end_id
        self.output, self.split_output, self.id = chat.output, chat.split_output, chat.id

    def __getattr__(self, name):
        return getattr(self._chat, name)

    def _count(self, ids) -> int:
        return sum(map(self._control.__contains__, ids))

    def _render(self, kind: str, text: str) -> list[int]:
        render = getattr(self._chat, kind)
        ids = render(text)
        if self._count(ids) != self._frame[kind]:
            ids = render(defuse(self._chat.tok, text, self._control))
        return ids

    def system(self, text: str) -> list[int]:
        return self._render("system", text)

    def turn_prompt(self, obs_text: str) -> list[int]:
        return self._render("turn_prompt", obs_text)


_WRAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain_chat(chat) -> PlainTextChat:
    """The `PlainTextChat` of `chat` (one per format: every organisation of a run shares it)."""
    if isinstance(chat, PlainTextChat):
        return chat
    wrapped = _WRAPPED.get(chat)
    if wrapped is None:
        wrapped = _WRAPPED[chat] = PlainTextChat(chat)
    return wrapped
