"""Byte, word and Hugging Face tokenizers: round trips, id layout, special-token safety."""

import json

import pytest

from avalon.tokenizer import ByteTokenizer, HFTokenizer, Special, Tokenizer, WordTokenizer
from avalon.tokenizer.word import CHARS

TEXTS = ["", "hello world", "post {\"channel\":\"#plan\",\"text\":\"hi @a1\"}\n\ttab",
         "naïve café 東京 🙂", "<|end|> is just text", "\x00\x7f control"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_specials_and_unknown_ids():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 256 + len(Special)
    ids = tok.special_ids
    assert sorted(ids.values()) == list(range(256, 256 + len(Special)))
    assert tok.decode([104, ids[Special.CALL], 105]) == "h<|call|>i"
    assert tok.decode([104, 10_000, -1]) == "h\ufffd\ufffd"
    assert tok.decode([0xC3]) == "\ufffd"  # a cut UTF-8 sequence is replaced, not raised


@pytest.mark.parametrize("text", TEXTS)
def test_word_round_trip(text):
    tok = WordTokenizer(["hello", "world", "post", "channel", "plan", "text", "hi", "end"])
    assert tok.decode(tok.encode(text)) == text


def test_word_layout_and_costs():
    tok = WordTokenizer(["hello", "world", "hello", "wait_for_messages"])
    assert tok.words == ["hello", "world", "wait_for_messages"]
    n_fixed = len(Special) + 1 + len(CHARS)
    assert len(CHARS) == 97
    assert tok.vocab_size == n_fixed + 3
    assert tok.encode("hello world") == [n_fixed, tok.encode(" ")[0], n_fixed + 1]
    assert tok.encode("wait_for_messages") == [n_fixed + 2]
    assert len(tok.encode("helloworld")) == 10  # not a listed word: spelt out
    assert len(tok.encode("é")) == 6  # two UTF-8 bytes, three ids each
    assert all(0 <= i < tok.vocab_size for i in tok.encode("東京 🙂 ok"))


def test_word_never_emits_specials_and_decodes_any_id():
    tok = WordTokenizer(["end"])
    specials = set(tok.special_ids.values())
    assert not specials & set(tok.encode("<|end|><|call|> end"))
    byte = len(Special)
    # A byte escape not followed by two hex digits (a model can sample it) decodes to U+FFFD.
    assert tok.decode([byte, tok.encode("z")[0]]) == "\ufffdz"
    assert tok.decode([byte]) == "\ufffd"
    assert tok.decode([tok.vocab_size, 10**6]) == "\ufffd\ufffd"
    assert tok.decode(tok.encode("a\ud800b")) == "a?b"  # lone surrogate: no crash


def test_word_rejects_bad_words():
    with pytest.raises(ValueError, match="'x'"):
        WordTokenizer(["x"])
    with pytest.raises(ValueError, match="two words"):
        WordTokenizer(["two words"])


def _train_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the agents post to #plan"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return tok


def test_hf_from_dir_specials_and_round_trip(tmp_path):
    pytest.importorskip("tokenizers")
    base = _train_tokenizer_json(tmp_path)
    n_base = base.get_vocab_size()
    tok = HFTokenizer.from_dir(tmp_path)
    ids = tok.special_ids
    # `<|end|>` already exists in the vocabulary: mapped, not added; the other four are added.
    assert ids[Special.END] == base.token_to_id("<|end|>")
    added = [ids[s] for s in Special if s is not Special.END]
    assert sorted(added) == list(range(n_base, n_base + 4))
    assert tok.vocab_size == n_base + 4
    for text in ["hello world", "naïve 東京", "post to #plan"]:
        assert tok.decode(tok.encode(text)) == text
    # Special strings in content stay text: never a control id.
    assert not set(ids.values()) & set(tok.encode("<|end|><|call|><s>"))
    assert tok.decode(tok.encode("<|end|> x")) == "<|end|> x"
    mixed = tok.encode("hi") + [ids[Special.CALL]] + tok.encode("post") + [ids[Special.END]]
    assert tok.decode(mixed) == "hi<|call|>post<|end|>"
    assert tok.decode([tok.vocab_size + 5]) == "\ufffd"
    assert tok.decode(tok.encode("a\ud800b")) == "a?b"


def test_hf_custom_special_strings(tmp_path):
    pytest.importorskip("tokenizers")
    _train_tokenizer_json(tmp_path)
    tok = HFTokenizer.from_dir(tmp_path, {Special.SYSTEM: "<s>"})
    assert tok.decode([tok.special_ids[Special.SYSTEM]]) == "<s>"
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_dir(tmp_path / "missing")
    with pytest.raises(ValueError, match="two specials"):
        HFTokenizer.from_dir(tmp_path, {Special.SYSTEM: "<|end|>"})
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
