"""The tokenizer protocol and the special tokens of the chat format, declared once.

Every tokenizer maps text to ids and back and gives each `Special` one id. `encode` never emits
a special id, whatever the text says: a teammate who writes the literal string "<|end|>" in a
message gets those characters, not the end-of-turn token. Special ids enter a context only
through the chat renderer (`avalon/tokenizer/chat.py`).
`decode` is total: special ids come back as their literal strings and ids the tokenizer does not
know as U+FFFD, because decoded ids are model outputs and nothing a model writes may raise.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

REPLACEMENT = "\ufffd"


class Special(enum.Enum):
    """The chat format's special tokens (value: the literal string that names each)."""

    SYSTEM = "<|system|>"  # opens the system segment (role card, roster, tools)
    OBS = "<|obs|>"  # opens an observation: tool results and delivered messages
    AGENT = "<|agent|>"  # opens the agent's own output (the model samples after it)
    CALL = "<|call|>"  # starts one tool call inside the agent's output
    END = "<|end|>"  # ends a segment; the engine's stop token for a turn


@runtime_checkable
class Tokenizer(Protocol):
    """What the organisation simulator and the engine need from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (every id is < vocab_size)."""
        ...

    @property
    def special_ids(self) -> Mapping[Special, int]:
        """The id of each special token (every `Special` for the native chat format; a
        templated HF tokenizer has `END` and `CALL` only, see `avalon/tokenizer/hf.py`)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Text to ids; never returns a special id."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text; specials as their literal strings, unknown ids as U+FFFD."""
        ...


def utf8_bytes(text: str) -> bytes:
    """UTF-8 of `text`; lone surrogates (valid in a Python str, not in UTF-8) become '?'."""
    return text.encode("utf-8", errors="replace")


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@functools.cache
def byte_values() -> dict[str, int]:
    """The byte-level BPE alphabet read back: character -> the byte it stands for."""
    return {c: b for b, c in byte_alphabet().items()}
