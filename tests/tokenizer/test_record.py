"""A run's tokenizer record rebuilds the same tokenizer: same ids for every string."""

import pytest

from avalon.tokenizer import ByteTokenizer, WordTokenizer
from avalon.tokenizer.record import describe, from_record

TEXT = "hire verifier_2 to check c17; ship it.\tΩ done"


def test_a_word_tokenizer_comes_back_with_the_same_ids():
    tok = WordTokenizer(("verifier_2", "hire", "check", "ship", "hire", "done"))
    again = from_record(describe(tok))
    assert again.words == ["verifier_2", "hire", "check", "ship", "done"]
    assert again.encode(TEXT) == tok.encode(TEXT) and again.vocab_size == tok.vocab_size
    # Another word order is another tokenizer: the record is what keeps the ids.
    other = WordTokenizer(("hire", "verifier_2", "check", "ship", "done"))
    assert other.encode(TEXT) != tok.encode(TEXT)


def test_a_byte_tokenizer_comes_back():
    again = from_record(describe(ByteTokenizer()))
    assert isinstance(again, ByteTokenizer) and again.encode(TEXT) == ByteTokenizer().encode(TEXT)


def test_bad_records_name_the_field():
    with pytest.raises(ValueError, match=r"run/x.json: kind='sentencepiece'"):
        from_record({"kind": "sentencepiece"}, where="run/x.json")
    with pytest.raises(ValueError, match="'words' must be a list of strings"):
        from_record({"kind": "word", "words": "hire ship"})
    with pytest.raises(ValueError, match="'path' must name the tokenizer's directory"):
        from_record({"kind": "hf"})
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        from_record(["word"])
    with pytest.raises(ValueError, match="an HF tokenizer needs the directory"):
        from avalon.tokenizer import HFTokenizer
        describe(HFTokenizer.__new__(HFTokenizer))
