"""The tokenizer and chat template a GGUF file carries, as a `tokenizers.Tokenizer`.

A GGUF has no tokenizer.json; llama.cpp's converter stores the vocabulary in metadata:
`tokenizer.ggml.model` (`gpt2` = byte-level BPE, the only kind read here), `.tokens` (already in
the byte-level alphabet), `.merges`, `.token_type` (1 normal, 3 control, 4 user-defined), the
bos / eos / padding / unknown ids, `add_bos_token` / `add_eos_token`, and `.pre`, the name of
the pre-tokenizer (how text is split before merging). The pre-tokenizers of the four families
Avalon imports, as llama.cpp defines them (llama-vocab.cpp):

  smollm (SmolLM / SmolLM2; llama.cpp gives starcoder, refact, command-r, codeshell the same)
      digits one by one, then GPT-2's split;
  llama-bpe (Llama 3; also `llama3`, `llama-v3`): Llama 3's split (contractions any case,
      numbers in runs of up to three), and merges skipped for a word already in the
      vocabulary (`ignore_merges`, as llama.cpp and Llama 3's tokenizer.json do);
  qwen2 (Qwen2, Qwen2.5, Qwen3; also `deepseek-r1-qwen`): the same split with single digits;
  gpt2: GPT-2's split.

Any other `.pre` is refused with one line naming the field. Control tokens become special
added tokens and user-defined ones plain added tokens (matched whole in text), as transformers
builds its tokenizer from the same file; so do a token spelled outside the byte alphabet (a
llama.cpp mislabel: transformers skips it as a control token and does not add it as a
user-defined one). Two known departures of transformers' GGUF tokenizer (5.24) from llama.cpp:
it keeps GPT-2's split for `smollm` (no digit split; SmolLM2's merges never join a digit to
anything, so ids come out the same) and leaves `ignore_merges` off for `llama-bpe`.

`load_gguf_tokenizer(path)` returns `avalon.tokenizer.hf.HFTokenizer` over it with the file's
chat template (`tokenizer.chat_template`); `write_gguf_tokenizer_files(path, directory)` writes
it as a Hugging Face checkpoint's tokenizer files (`avalon/tokenizer/hf_files.py`).
"""

from __future__ import annotations

import dataclasses
import os

from avalon.checkpoint.gguf import GgufCheckpoint, GgufError
from avalon.tokenizer.base import byte_alphabet
from avalon.tokenizer.hf import HFTokenizer
from avalon.tokenizer.hf_files import post_processor, write_tokenizer_files

_GPT2_SPLIT = None  # GPT-2's split is ByteLevel's own regex
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (split regex before byte-level, digits one by one, ignore_merges)
PRE_TOKENIZERS = {
    "smollm": (_GPT2_SPLIT, True, False), "starcoder": (_GPT2_SPLIT, True, False),
    "refact": (_GPT2_SPLIT, True, False), "command-r": (_GPT2_SPLIT, True, False),
    "codeshell": (_GPT2_SPLIT, True, False),
    "llama-bpe": (_LLAMA3_SPLIT, False, True), "llama3": (_LLAMA3_SPLIT, False, True),
    "llama-v3": (_LLAMA3_SPLIT, False, True),
    "qwen2": (_QWEN2_SPLIT, False, False), "deepseek-r1-qwen": (_QWEN2_SPLIT, False, False),
    "gpt2": (_GPT2_SPLIT, False, False),
}
CONTROL, USER_DEFINED = 3, 4


@dataclasses.dataclass(frozen=True)
class GgufVocab:
    """What the file says about its tokenizer besides the vocabulary itself."""

    pre: str
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    add_bos_token: bool
    add_eos_token: bool

    def file_fields(self) -> dict:
        """`write_tokenizer_files`' keyword arguments for this vocabulary."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "pre"}


def gguf_tokenizer(source: str | os.PathLike | GgufCheckpoint):
    """(`tokenizers.Tokenizer`, `GgufVocab`) of a GGUF file (a path or an open checkpoint)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ck = source if isinstance(source, GgufCheckpoint) else GgufCheckpoint(source)
    where = str(ck.path)
    kind = ck.metadata("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GgufError(f"{where}: tokenizer.ggml.model is {kind!r}; Avalon reads byte-level BPE "
                        "('gpt2') vocabularies")
    pre = ck.metadata("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise GgufError(f"{where}: tokenizer.ggml.pre is {pre!r}; Avalon reads "
                        f"{', '.join(PRE_TOKENIZERS)}")
    split, digits, ignore_merges = PRE_TOKENIZERS[pre]
    tokens = ck.metadata("tokenizer.ggml.tokens")
    types = ck.metadata("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ")) for m in ck.metadata("tokenizer.ggml.merges")]
    alphabet = set(byte_alphabet().values())
    spell = byte_alphabet()
    vocab = {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GgufError(f"{where}: tokenizer.ggml.tokens holds a token twice")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab])

    def token(key):
        i = ck.metadata(f"tokenizer.ggml.{key}", None)
        if i is None:
            return None
        if not 0 <= i < len(tokens):
            raise GgufError(f"{where}: tokenizer.ggml.{key} is {i}, outside the "
                            f"{len(tokens)}-token vocabulary")
        return tokens[i]

    info = GgufVocab(pre=pre, chat_template=ck.metadata("tokenizer.chat_template", None),
                     bos_token=token("bos_token_id"), eos_token=token("eos_token_id"),
                     pad_token=token("padding_token_id"), unk_token=token("unknown_token_id"),
                     add_bos_token=bool(ck.metadata("tokenizer.ggml.add_bos_token", False)),
                     add_eos_token=bool(ck.metadata("tokenizer.ggml.add_eos_token", False)))
    tok.post_processor = post_processor(tok, info.bos_token if info.add_bos_token else None,
                                        info.eos_token if info.add_eos_token else None)
    return tok, info


def load_gguf_tokenizer(source: str | os.PathLike | GgufCheckpoint, *,
                        use_chat_template: bool = True, text_calls: bool = False) -> HFTokenizer:
    """`HFTokenizer` over a GGUF file's vocabulary, with its chat template (unless
    `use_chat_template=False`, or the file has none) and `text_calls` (see HFTokenizer)."""
    tok, info = gguf_tokenizer(source)
    template = info.chat_template if use_chat_template else None
    return HFTokenizer(tok, chat_template=template, text_calls=text_calls and template is not None)


def write_gguf_tokenizer_files(source: str | os.PathLike | GgufCheckpoint,
                               directory: str | os.PathLike, **kwargs) -> list[str]:
    """A GGUF file's tokenizer as HF tokenizer files in `directory` (`write_tokenizer_files`;
    `kwargs`, e.g. model_max_length, pass through)."""
    tok, info = gguf_tokenizer(source)
    return write_tokenizer_files(directory, tok, **info.file_fields(), **kwargs)
