"""Tokenizers and the one chat format.

- `Tokenizer` (protocol) and `Special` (the chat specials, declared once): `base.py`.
- `ByteTokenizer`: UTF-8 bytes + specials. `WordTokenizer(words)`: compact word-level ids for
  toy presets. `HFTokenizer.from_dir(path)`: a checkpoint's `tokenizer.json` via `tokenizers`.
- `gguf.load_gguf_tokenizer(path)`: the vocabulary and chat template of a GGUF file as an
  `HFTokenizer`; `hf_files.write_tokenizer_files(directory, tokenizer, ...)`: an HF export's
  tokenizer.json, tokenizer_config.json and special_tokens_map.json.
- `ChatFormat`: how system prompts, observations, outputs and tool calls become ids (`chat.py`).
"""

from avalon.tokenizer.base import Special, Tokenizer
from avalon.tokenizer.byte import ByteTokenizer
from avalon.tokenizer.chat import ChatFormat, OutputParts
from avalon.tokenizer.hf import HFTokenizer
from avalon.tokenizer.word import WordTokenizer

__all__ = ["ByteTokenizer", "ChatFormat", "HFTokenizer", "OutputParts", "Special", "Tokenizer",
           "WordTokenizer"]
