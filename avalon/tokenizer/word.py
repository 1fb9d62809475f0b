"""A compact word-level tokenizer for toy presets (vocabularies of a few hundred ids).

Id layout (fixed, so a toy checkpoint's embedding rows keep their meaning):
  0 .. 4          the chat specials, in `Special` declaration order
  5               `<|byte|>`, the escape for a byte outside printable ASCII
  6 .. 102        single characters: tab, newline, then printable ASCII 0x20..0x7E (97 ids)
  103 ..          the caller's words, in the order given (duplicates after the first ignored)

Encoding splits text into runs of `[A-Za-z0-9_]` and single other characters. A run that is a
listed word is one token; any other run is spelt one character per token. A character outside
the 97 is spelt as its UTF-8 bytes, each `<|byte|>` plus two lowercase hex-digit tokens (so the
fallback costs no extra ids). Decoding is the inverse, so `decode(encode(s)) == s` for every
string (lone surrogates, which UTF-8 cannot hold, become '?'). A `<|byte|>` not followed by two
hex digits (a model can sample that) decodes to U+FFFD and the following ids decode normally.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from avalon.tokenizer.base import REPLACEMENT, Special, utf8_bytes

BYTE_ESCAPE = "<|byte|>"
CHARS = "\t\n" + "".join(chr(c) for c in range(0x20, 0x7F))
_WORD = re.compile(r"[A-Za-z0-9_]+")
_PIECE = re.compile(r"[A-Za-z0-9_]+|.", re.DOTALL)
_HEX = "0123456789abcdef"


class WordTokenizer:
    """Each listed word one token; everything else spelt by characters (and escaped bytes)."""

    def __init__(self, words: Sequence[str]):
        self._special_ids = {s: i for i, s in enumerate(Special)}
        self._special_by_id = {i: s for s, i in self._special_ids.items()}
        self._byte_id = len(Special)
        self._char_base = self._byte_id + 1
        self._char_ids = {c: self._char_base + i for i, c in enumerate(CHARS)}
        word_base = self._char_base + len(CHARS)
        self._word_ids: dict[str, int] = {}
        for w in words:
            if not isinstance(w, str) or not _WORD.fullmatch(w) or len(w) < 2:
                raise ValueError(f"WordTokenizer word {w!r}: words are runs of [A-Za-z0-9_] "
                                 "of length >= 2 (single characters already have ids)")
            if w not in self._word_ids:
                self._word_ids[w] = word_base + len(self._word_ids)
        self._words = list(self._word_ids)
        self._word_base = word_base
        self._hex_ids = {self._char_ids[h]: k for k, h in enumerate(_HEX)}

    @property
    def vocab_size(self) -> int:
        return self._word_base + len(self._words)

    @property
    def special_ids(self) -> Mapping[Special, int]:
        return self._special_ids

    @property
    def words(self) -> list[str]:
        """The word list (after removing duplicates), in id order."""
        return list(self._words)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            word = self._word_ids.get(piece)
            if word is not None:
                ids.append(word)
                continue
            for ch in piece:
                cid = self._char_ids.get(ch)
                if cid is not None:
                    ids.append(cid)
                    continue
                for b in utf8_bytes(ch):
                    ids += [self._byte_id, self._char_ids[_HEX[b >> 4]],
                            self._char_ids[_HEX[b & 15]]]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        out: list[str] = []
        buf = bytearray()
        i = 0
        while i < len(ids):
            t = ids[i]
            if t == self._byte_id:
                hi = self._hex_ids.get(ids[i + 1]) if i + 1 < len(ids) else None
                lo = self._hex_ids.get(ids[i + 2]) if i + 2 < len(ids) else None
                if hi is not None and lo is not None:
                    buf.append(hi * 16 + lo)
                    i += 3
                    continue
                out.append(buf.decode("utf-8", errors="replace") + REPLACEMENT)
                buf.clear()
                i += 1
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            out.append(self._piece(t))
            i += 1
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def _piece(self, t: int) -> str:
        special = self._special_by_id.get(t)
        if special is not None:
            return special.value
        if self._char_base <= t < self._word_base:
            return CHARS[t - self._char_base]
        if self._word_base <= t < self.vocab_size:
            return self._words[t - self._word_base]
        return REPLACEMENT
