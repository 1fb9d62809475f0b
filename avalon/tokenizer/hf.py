"""A Hugging Face `tokenizers` tokenizer loaded from a checkpoint's `tokenizer.json`.

The chat specials (`Special`) map to tokens the vocabulary already has when their strings are
given in `special_strings` and present; otherwise they are added as special tokens after the
existing vocabulary (check `vocab_size` against the model's). `encode` treats every special
string in the text as plain text (`encode_special_tokens`), so message content can never
produce a control token; the renderer inserts special ids directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from avalon.tokenizer.base import REPLACEMENT, Special, utf8_bytes


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer`; see the module docstring for the special-token rules.

    `decode` writes a special id as its string in this vocabulary (`special_strings`).
    """

    def __init__(self, tok, special_strings: Mapping[Special, str] | None = None):
        from tokenizers import AddedToken  # the [hf] extra; imported only when used

        strings = {s: s.value for s in Special}
        if special_strings is not None:
            for key, value in special_strings.items():
                if not isinstance(key, Special):
                    raise ValueError(f"HFTokenizer special_strings key {key!r} is not a Special")
                strings[key] = value
        self._tok = tok
        ids = {}
        for special, text in strings.items():
            i = tok.token_to_id(text)
            if i is None:
                tok.add_special_tokens([AddedToken(text, special=True)])
                i = tok.token_to_id(text)
            ids[special] = i
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"HFTokenizer special_strings map two specials to one id: {ids}")
        tok.encode_special_tokens = True
        self._special_ids = ids
        self._special_by_id = {i: s for s, i in ids.items()}
        self._strings = strings
        self._size = tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: str | os.PathLike,
                 special_strings: Mapping[Special, str] | None = None) -> HFTokenizer:
        """Loads `path/tokenizer.json` (a checkpoint directory)."""
        from tokenizers import Tokenizer

        file = os.path.join(os.fspath(path), "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"HFTokenizer.from_dir: no tokenizer.json in {path!r}")
        return cls(Tokenizer.from_file(file), special_strings)

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def special_ids(self) -> Mapping[Special, int]:
        return self._special_ids

    def encode(self, text: str) -> list[int]:
        text = utf8_bytes(text).decode("utf-8")  # the Rust side rejects lone surrogates
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            special = self._special_by_id.get(i)
            if special is None and 0 <= i < self._size:
                run.append(i)
                continue
            if run:
                out.append(self._tok.decode(run, skip_special_tokens=False))
                run = []
            out.append(self._strings[special] if special is not None else REPLACEMENT)
        if run:
            out.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(out)
