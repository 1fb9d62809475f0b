"""A run's tokenizer, written down so that later tools rebuild it with the same ids.

    record = describe(tok, hf_path)          # a JSON-able dict; the run writes it to
    tok = from_record(record, where="RUN/tokenizer_record.json")   # WORKDIR/tokenizer_record.json

A word tokenizer's ids depend on the words of the environments the run trained on, in order, so
a tool that evaluates the run elsewhere (the safety suite, other environments) cannot rebuild
them from its own environments: it reads the record. `{"kind": "word", "words": [...]}` keeps
the word list in id order; `{"kind": "byte"}`; `{"kind": "hf", "path": DIR}` names the
directory the run read its `tokenizer.json` (and chat template) from, or its GGUF file, and
`"text_calls": true` when its tool calls were spelt in text (`HFTokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from avalon.tokenizer.byte import ByteTokenizer
from avalon.tokenizer.hf import HFTokenizer
from avalon.tokenizer.word import WordTokenizer

RECORD_FILE = "tokenizer_record.json"


def describe(tok, hf_path: str = "") -> dict:
    if isinstance(tok, WordTokenizer):
        return {"kind": "word", "words": tok.words}
    if isinstance(tok, ByteTokenizer):
        return {"kind": "byte"}
    if isinstance(tok, HFTokenizer):
        if not hf_path:
            raise ValueError("tokenizer record: an HF tokenizer needs the directory it was read "
                             "from (hf_path)")
        text_calls = tok.rendering is not None and tok.rendering.text_calls is not None
        return {"kind": "hf", "path": str(hf_path), "text_calls": text_calls}
    raise ValueError(f"tokenizer record: cannot describe a {type(tok).__name__}")


def from_record(record: Mapping, where: str = "tokenizer record"):
    """The tokenizer a record describes; errors name `where` and the bad field."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    kind = record.get("kind")
    if kind == "word":
        words = record.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(f"{where}: 'words' must be a list of strings")
        return WordTokenizer(tuple(words))
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        path = record.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"{where}: 'path' must name the tokenizer's directory, got {path!r}")
        text_calls = record.get("text_calls", False)
        if not isinstance(text_calls, bool):
            raise ValueError(f"{where}: 'text_calls' must be true or false, got {text_calls!r}")
        if os.path.isfile(path):
            from avalon.tokenizer.gguf import load_gguf_tokenizer
            return load_gguf_tokenizer(path, text_calls=text_calls)
        return HFTokenizer.from_dir(path, text_calls=text_calls)
    raise ValueError(f"{where}: kind={kind!r}; use 'word', 'byte' or 'hf'")
