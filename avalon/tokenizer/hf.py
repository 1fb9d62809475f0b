"""A Hugging Face `tokenizers` tokenizer loaded from a checkpoint's `tokenizer.json`.

With a chat template (`from_dir` reads the directory's; `avalon/tokenizer/template.py`), the
organisation renders through the template's markup and special tokens (`rendering`): only
`<|end|>` (the template's end of turn) and `<|call|>` (the vocabulary's `<tool_call>`) are
`Special`s, and a token is added only when the vocabulary has none (`<|call|>` without
`<tool_call>`). With `text_calls=True` nothing is added: calls are spelt in text between
`<tool_call>` markers (`Rendering.text_calls`, avalon/tokenizer/chat.py), which a pretrained
model without that token can write zero-shot; only `<|end|>` is then a `Special`. Without a
template, the chat specials map to tokens the vocabulary already has when their strings are
given in `special_strings` and present, and are added otherwise.
Added tokens go after the existing vocabulary (check `vocab_size` against the model's) and are
listed in `added` (id -> string), so a checkpoint's embedding rows for them can be initialised
from existing rows (`avalon.train.setup.init_added_rows`). `encode` treats every special
string in the text as plain text (`encode_special_tokens`), so message content can never
produce a control token; the renderer inserts special ids directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from avalon.tokenizer import template
from avalon.tokenizer.base import REPLACEMENT, Special, byte_values, utf8_bytes
from avalon.tokenizer.chat import Rendering


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer`; see the module docstring for the special-token rules.

    `decode` writes a special id as its string in this vocabulary (`special_strings`).
    """

    def __init__(self, tok, special_strings: Mapping[Special, str] | None = None, *,
                 chat_template: str | None = None, text_calls: bool = False):
        from tokenizers import AddedToken  # the [hf] extra; imported only when used

        self._tok = tok
        vocab_specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        is_special = lambda text: tok.token_to_id(text) in vocab_specials
        m = None
        if text_calls and chat_template is None:
            raise ValueError("HFTokenizer: text_calls=True needs a chat template")
        if chat_template is not None:
            m = template.markup(chat_template, is_special)
            has_call = tok.token_to_id(template.TOOL_CALL) is not None
            strings = {Special.END: m.end}
            if not text_calls:
                strings[Special.CALL] = template.TOOL_CALL if has_call else Special.CALL.value
        else:
            strings = {s: s.value for s in Special}
        if special_strings is not None:
            for key, value in special_strings.items():
                if not isinstance(key, Special):
                    raise ValueError(f"HFTokenizer special_strings key {key!r} is not a Special")
                if chat_template is not None and key not in strings:
                    raise ValueError(f"HFTokenizer special_strings: {key} is template markup "
                                     "with a chat template")
                strings[key] = value
        ids, self.added = {}, {}
        for special, text in strings.items():
            i = tok.token_to_id(text)
            if i is None:
                tok.add_special_tokens([AddedToken(text, special=True)])
                i = tok.token_to_id(text)
                self.added[i] = text
            ids[special] = i
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"HFTokenizer special_strings map two specials to one id: {ids}")
        tok.encode_special_tokens = True
        self._special_ids = ids
        self._special_by_id = {i: s for s, i in ids.items()}
        self._strings = strings
        self._size = tok.get_vocab_size(with_added_tokens=True)
        self.chat_template = chat_template
        self.rendering: Rendering | None = None
        if m is not None and text_calls:
            self.rendering = Rendering(
                system_open=tuple(self.encode_markup(m.system_open)),
                obs_open=tuple(self.encode_markup(m.obs_open)),
                agent_open=tuple(self.encode_markup(m.agent_open)),
                end=ids[Special.END], call=-1, sep=tuple(self.encode_markup(m.sep)),
                control=frozenset(vocab_specials | set(ids.values())),
                text_calls=(template.TOOL_CALL, template.TOOL_CALL_CLOSE))
        elif m is not None:
            close = tok.token_to_id(template.TOOL_CALL_CLOSE) \
                if strings[Special.CALL] == template.TOOL_CALL else None
            self.rendering = Rendering(
                system_open=tuple(self.encode_markup(m.system_open)),
                obs_open=tuple(self.encode_markup(m.obs_open)),
                agent_open=tuple(self.encode_markup(m.agent_open)),
                end=ids[Special.END], call=ids[Special.CALL],
                call_close=() if close is None else (close,),
                sep=tuple(self.encode_markup(m.sep)),
                control=frozenset(vocab_specials | set(ids.values())))

    @classmethod
    def from_dir(cls, path: str | os.PathLike,
                 special_strings: Mapping[Special, str] | None = None, *,
                 use_chat_template: bool = True, text_calls: bool = False) -> HFTokenizer:
        """Loads `path/tokenizer.json` (a checkpoint directory) and, unless
        `use_chat_template=False`, the directory's chat template."""
        from tokenizers import Tokenizer

        file = os.path.join(os.fspath(path), "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"HFTokenizer.from_dir: no tokenizer.json in {path!r}")
        chat_template = template.read_template(path) if use_chat_template else None
        return cls(Tokenizer.from_file(file), special_strings, chat_template=chat_template,
                   text_calls=text_calls)

    def encode_markup(self, text: str) -> list[int]:
        """Template markup to ids, its special tokens recognised (never for message text)."""
        self._tok.encode_special_tokens = False
        try:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        finally:
            self._tok.encode_special_tokens = True

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def special_ids(self) -> Mapping[Special, int]:
        return self._special_ids

    @property
    def added_token_ids(self) -> frozenset[int]:
        """Every token the vocabulary adds to its model, special or not (Qwen ships
        `<tool_call>` non-special: `encode` matches it in text). `avalon/org/plain_text.py`
        keeps message text from encoding any of them."""
        return frozenset(self._tok.get_added_tokens_decoder())

    def encode(self, text: str) -> list[int]:
        text = utf8_bytes(text).decode("utf-8")  # the Rust side rejects lone surrogates
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def token_bytes(self, i: int) -> bytes:
        """The bytes one id stands for (a byte-level BPE piece may be part of a UTF-8
        character, which `decode` shows as U+FFFD); a special's string for a special."""
        piece = None if i in self._special_by_id else self._tok.id_to_token(int(i))
        values = byte_values()
        if piece is not None and all(c in values for c in piece):
            return bytes(values[c] for c in piece)
        return self.decode([i]).encode("utf-8")

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
