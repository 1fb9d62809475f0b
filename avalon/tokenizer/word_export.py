"""The toy's word tokenizer as a Hugging Face `tokenizers.Tokenizer` (for an export's
tokenizer.json), with the same ids.

`WordTokenizer` splits text into runs of `[A-Za-z0-9_]` and single other characters; a run that
is a listed word is one id, any other run is spelt one character per id. The same here:
- pre-tokenizer: a regex split into exactly those runs and characters (isolated);
- model: BPE over the whole id table (specials, `<|byte|>`, the 97 characters, the words) with
  no merges and `ignore_merges`, so a piece that is in the table (a word or a character) is its
  id and any other piece falls apart into its characters;
- decoder: `Fuse` (the pieces concatenated, no spaces added).

The five chat specials and `<|byte|>` are special added tokens. What a `tokenizers` table
cannot do: a character outside tab, newline and printable ASCII (the toy's environments write
none) is `WordTokenizer`'s `<|byte|>` and two hex digits but here the unknown token `<|byte|>`
alone; and a special's string inside text is plain characters there, the special here. So
ids agree on every text of the 97 characters without special strings, and decoding agrees
on every id sequence (a `<|byte|>` escape decodes as its text here).
"""

from __future__ import annotations

from avalon.tokenizer.word import BYTE_ESCAPE, CHARS, WordTokenizer

PIECE_PATTERN = r"[A-Za-z0-9_]+|[\s\S]"  # WordTokenizer's pieces: `[A-Za-z0-9_]+|.` (DOTALL)


def word_table(tok: WordTokenizer) -> dict[str, int]:
    """Every id of `tok` by its string: the specials, `<|byte|>`, the characters and the words
    (the layout `avalon/tokenizer/word.py` fixes), each checked against `tok` itself."""
    table = {s.value: i for s, i in tok.special_ids.items()}
    table[BYTE_ESCAPE] = len(table)
    for text in (*CHARS, *tok.words):
        ids = tok.encode(text)
        if len(ids) != 1 or text in table:
            raise ValueError(f"word tokenizer: {text!r} is not one id of its own ({ids})")
        table[text] = ids[0]
    if sorted(table.values()) != list(range(tok.vocab_size)):
        raise ValueError("word tokenizer: its ids are not the documented layout")
    return table


def as_tokenizers(tok: WordTokenizer):
    """A `tokenizers.Tokenizer` with `tok`'s ids (see the module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    table = word_table(tok)
    out = Tokenizer(models.BPE(vocab=table, merges=[], unk_token=BYTE_ESCAPE,
                               ignore_merges=True))
    out.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    out.decoder = decoders.Fuse()
    specials = [s.value for s in tok.special_ids] + [BYTE_ESCAPE]
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for s in specials:  # added tokens keep the ids the table gave them
        assert out.token_to_id(s) == table[s], s
    return out
