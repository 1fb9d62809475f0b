"""A Hugging Face checkpoint directory's tokenizer files, written from a `tokenizers.Tokenizer`.

`write_tokenizer_files(directory, tokenizer, ...)` writes
  tokenizer.json            the tokenizer itself (vocabulary, merges, pre-tokenizer, decoder, the
                            post-processor that adds BOS / EOS, added tokens);
  tokenizer_config.json     class `PreTrainedTokenizerFast` (which reads tokenizer.json as it is,
                            in transformers 4 and 5), the bos / eos / pad / unk token strings,
                            `add_bos_token` / `add_eos_token`, `chat_template`, and
                            `added_tokens_decoder` (what transformers itself writes);
  special_tokens_map.json   the same token strings, for readers that look there;
so that `transformers.AutoTokenizer.from_pretrained(directory)` encodes and decodes as the
tokenizer does. The post-processor is rebuilt from `add_bos_token` / `add_eos_token`, so the two
files cannot disagree. Each file appears under its name only once complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def post_processor(tok, bos: str | None, eos: str | None):
    """What `encode(..., add_special_tokens=True)` adds: BOS before and / or EOS after."""
    from tokenizers import processors

    single, pair = "$A", "$A $B:1"
    special = []
    if bos is not None:
        single, pair = f"{bos} {single}", f"{bos} $A {bos}:1 $B:1"
        special.append((bos, tok.token_to_id(bos)))
    if eos is not None:
        single = f"{single} {eos}"
        pair = (f"{bos} $A {eos} {bos}:1 $B:1 {eos}:1" if bos is not None
                else f"$A {eos} $B:1 {eos}:1")
        special.append((eos, tok.token_to_id(eos)))
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=list(dict(special).items()))


def write_tokenizer_files(directory: str | os.PathLike, tokenizer, *,
                          chat_template: str | None = None, bos_token: str | None = None,
                          eos_token: str | None = None, pad_token: str | None = None,
                          unk_token: str | None = None, add_bos_token: bool = False,
                          add_eos_token: bool = False,
                          model_max_length: int | None = None) -> list[str]:
    """Write the three files into `directory` (created if needed); returns their names.
    `tokenizer` is a `tokenizers.Tokenizer` or an `HFTokenizer` (its vocabulary is written as
    it stands, tokens it added included). Every named token must be in the vocabulary."""
    from tokenizers import Tokenizer

    # HFTokenizer keeps its `tokenizers.Tokenizer` as `_tok` (no public accessor yet).
    backend = getattr(tokenizer, "_tok", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"write_tokenizer_files: {type(tokenizer).__name__} is not a "
                        "tokenizers.Tokenizer or HFTokenizer")
    named = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token,
             "unk_token": unk_token}
    for key, text in named.items():
        if text is not None and backend.token_to_id(text) is None:
            raise ValueError(f"write_tokenizer_files: {key} {text!r} is not in the vocabulary")
    if (add_bos_token and bos_token is None) or (add_eos_token and eos_token is None):
        raise ValueError("write_tokenizer_files: add_bos_token / add_eos_token need the token")
    tok = Tokenizer.from_str(backend.to_str())  # a copy: the caller's post-processor stays
    tok.post_processor = post_processor(tok, bos_token if add_bos_token else None,
                                        eos_token if add_eos_token else None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "tokenizer.json", tok.to_str(pretty=True))
    special = {k: v for k, v in named.items() if v is not None}
    added = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                      "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
             for i, t in sorted(tok.get_added_tokens_decoder().items())}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
              "add_bos_token": add_bos_token, "add_eos_token": add_eos_token,
              "clean_up_tokenization_spaces": False, "added_tokens_decoder": added}
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write(directory / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False)
           + "\n")
    _write(directory / "special_tokens_map.json", json.dumps(special, indent=2,
                                                             ensure_ascii=False) + "\n")
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
