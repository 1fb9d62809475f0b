"""The tool-call text format: what parses, what is a malformed turn."""

import pytest

from avalon.org.toolcall import Call, format_call, parse_call, parse_turn
from avalon.tokenizer import ByteTokenizer, ChatFormat, Special

CHAT = ChatFormat(ByteTokenizer())


def _turn(text, calls, max_calls=8):
    return parse_turn(CHAT, CHAT.output(text, calls), max_calls)


def test_calls_parse():
    p = _turn("thinking", ['hire {"title":"QA","role":"r","tools":["a"]}', "wait_for_messages",
                           '  post{"channel":"plan","text":"x"}  \n'])
    assert p.error is None and p.ended and p.text == "thinking"
    assert p.calls == (Call("hire", {"title": "QA", "role": "r", "tools": ["a"]}),
                       Call("wait_for_messages", {}),
                       Call("post", {"channel": "plan", "text": "x"}))
    assert _turn("just text", []).calls == ()


@pytest.mark.parametrize("text,why", [
    ('hire {"title": }', "not valid JSON"),
    ('hire ["a"]', "expected a tool name"),
    ('hire "x"', "expected a tool name"),
    ('hire {"a":1} trailing', "expected a tool name"),
    ('Hire {"a":1}', "expected a tool name"),
    ("", "expected a tool name"),
    ('x {"v": NaN}', "not valid JSON"),
    ('x {"a":' + "[" * 100000 + "]" * 100000 + "}", "not valid JSON"),  # RecursionError
    ('x {"a":' + "1" * 5000 + "}", "not valid JSON"),
    ('x {"a":[1,2]', "expected a tool name"),
])
def test_bad_calls(text, why):
    call, error = parse_call(text)
    assert call is None and why in error
    p = _turn("", ["wait_for_messages", text])
    assert p.calls == () and p.error.startswith("call 2:")


def test_not_an_object():
    call, error = parse_call("x {}")
    assert call == Call("x", {}) and error is None
    # A JSON value that is not an object cannot match the grammar's braces.
    assert parse_call("x [1]")[1] is not None


def test_structure_errors():
    too_many = _turn("", ["wait_for_messages"] * 3, max_calls=2)
    assert too_many.error == "3 calls in one turn; the limit is 2" and too_many.calls == ()
    ids = CHAT.output("x", ["roster"])
    stray = ids[:1] + [CHAT.id(Special.OBS)] + ids[1:]
    assert "stray <|obs|>" in parse_turn(CHAT, stray, 8).error
    cut = parse_turn(CHAT, ids[:-1], 8)  # no <|end|>: parsed as it stands
    assert not cut.ended and cut.calls == (Call("roster", {}),)


def test_format_call_round_trips():
    args = {"text": "naïve \"quoted\"\nline", "n": 3, "tools": []}
    assert format_call("roster") == "roster" and format_call("roster", {}) == "roster"
    assert parse_call(format_call("post", args)) == (Call("post", args), None)
