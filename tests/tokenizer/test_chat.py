"""The chat format: segment layout, outputs, and splitting sampled outputs."""

import pytest

from avalon.tokenizer import ByteTokenizer, ChatFormat, Special, WordTokenizer


@pytest.fixture(params=["byte", "word"])
def chat(request):
    if request.param == "byte":
        return ChatFormat(ByteTokenizer())
    return ChatFormat(WordTokenizer(["hire", "title", "post", "wait_for_messages"]))


def test_segments_layout(chat):
    tok = chat.tok
    ids = tok.special_ids
    assert chat.system("card") == [ids[Special.SYSTEM], *tok.encode("card"), ids[Special.END]]
    prompt = chat.turn_prompt("obs")
    assert prompt == [ids[Special.OBS], *tok.encode("obs"), ids[Special.END], ids[Special.AGENT]]
    assert chat.end_id == ids[Special.END]
    out = chat.output("plan", ['hire {"title":"QA"}', "wait_for_messages"])
    assert tok.decode(out) == 'plan<|call|>hire {"title":"QA"}<|call|>wait_for_messages<|end|>'


def test_split_output_round_trip(chat):
    out = chat.output("some text", ['post {"a":1}', "wait_for_messages"])
    parts = chat.split_output(out)
    assert parts.text == "some text"
    assert parts.calls == ('post {"a":1}', "wait_for_messages")
    assert parts.ended and parts.error is None
    call_at = out.index(chat.id(Special.CALL), 1 + out.index(chat.id(Special.CALL)))
    cut = chat.split_output(out[:call_at + 2])  # cut two tokens into the second call
    assert not cut.ended
    assert cut.calls[0] == 'post {"a":1}'
    assert cut.calls[1] == chat.tok.decode(out[call_at + 1:call_at + 2])


def test_split_output_stray_specials(chat):
    ids = chat.tok.special_ids
    for special in (Special.SYSTEM, Special.OBS, Special.AGENT, Special.END):
        out = chat.tok.encode("x") + [ids[special]] + chat.tok.encode("y") + [ids[Special.END]]
        parts = chat.split_output(out)
        assert parts.error is not None and special.value in parts.error
    assert chat.split_output([]).error is None
    assert chat.split_output([]).ended is False
    with pytest.raises(ValueError, match="CALL"):
        ChatFormat(_NoSpecials())


class _NoSpecials:
    vocab_size = 256
    special_ids = {}

    def encode(self, text):
        return []

    def decode(self, ids):
        return ""
