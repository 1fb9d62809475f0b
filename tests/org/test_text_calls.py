"""Tool calls spelt in text (`Rendering.text_calls`): what a pretrained model without a call
token writes, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, through SmolLM2's own
vocabulary and chat template.

Round trip: a scripted output rendered by `ChatFormat.output` parses back to the same calls and
free text. Parsing: the JSON object (and "parameters", string arguments, a list of objects), the
native `NAME {JSON}` between the markers, an unclosed last call; malformed: bad JSON, a non-tool
name, non-object arguments, a stray control token, more calls than the limit. Nothing raises.
"""

import pytest

from avalon.org.config import PromptStyle
from avalon.org.prompts import JSON_CALL_FORMAT, role_card
from avalon.org.toolcall import Call, format_call, parse_turn
from avalon.tokenizer.chat import ChatFormat, split_text_calls
from avalon.tokenizer.gguf import load_gguf_tokenizer
from tests.checkpoint.gguf_files import smollm2_file


@pytest.fixture(scope="module")
def chat():
    tok = load_gguf_tokenizer(smollm2_file(), text_calls=True)
    assert tok.vocab_size == 49152 and not tok.added  # nothing added to the vocabulary
    return ChatFormat(tok, tok.rendering)


def test_split_text_calls():
    assert split_text_calls("no calls", "<a>", "</a>") == ("no calls", ())
    assert split_text_calls("x <a>1</a> y <a>2</a> z", "<a>", "</a>") == ("x ", ("1", "2"))
    assert split_text_calls("x <a>1</a><a>2", "<a>", "</a>") == ("x ", ("1", "2"))
    assert split_text_calls("<a>1<a>2</a>", "<a>", "</a>") == ("", ("1", "2"))


def test_scripted_output_round_trips(chat):
    calls = [("hire", {"title": "Lead Engineer", "role": "build the parser",
                       "tools": ["write_file", "run_code"]}),
             ("create_channel", {"name": "plan"}), ("wait_for_messages", {})]
    ids = chat.output("Two parts, two people.",
                      [format_call(n, a, json_call=True) for n, a in calls])
    assert ids[-1] == chat.end_id and chat.end_id not in ids[:-1]
    text = chat.tok.decode(ids)
    assert '<tool_call>{"name": "hire", "arguments": {"title": "Lead Engineer"' in text
    turn = parse_turn(chat, ids, max_calls=8)
    assert turn.error is None and turn.ended
    assert turn.text.strip() == "Two parts, two people."
    assert turn.calls == tuple(Call(n, a) for n, a in calls)


def _parse(chat, text, max_calls=8):
    return parse_turn(chat, chat.tok.encode(text) + [chat.end_id], max_calls)


@pytest.mark.parametrize("text,calls", [
    ('ok <tool_call>{"name": "post", "parameters": {"channel": "plan", "text": "hi"}}'
     "</tool_call>", [Call("post", {"channel": "plan", "text": "hi"})]),
    ('<tool_call>{"name": "post", "arguments": "{\\"channel\\": \\"plan\\"}"}</tool_call>',
     [Call("post", {"channel": "plan"})]),
    ('<tool_call>[{"name": "a_b", "arguments": {}}, {"name": "c"}]</tool_call>',
     [Call("a_b", {}), Call("c", {})]),
    ('<tool_call>post {"channel": "plan"}</tool_call>', [Call("post", {"channel": "plan"})]),
    ('<tool_call>{"name": "wait_for_messages", "arguments": {}}', [Call("wait_for_messages",
                                                                        {})]),
    ("Just thinking aloud, no call.", []),
])
def test_well_formed(chat, text, calls):
    turn = _parse(chat, text)
    assert turn.error is None, turn.error
    assert list(turn.calls) == calls


@pytest.mark.parametrize("text,why", [
    ('<tool_call>{"name": "post", "arguments": {"a": }}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "Post Now", "arguments": {}}</tool_call>', "tool name"),
    ('<tool_call>{"arguments": {}}</tool_call>', "tool name"),
    ('<tool_call>{"name": "post", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "post", "arguments": {"x": NaN}}</tool_call>', "not valid JSON"),
    ("<tool_call>[]</tool_call>", "empty list"),
    ("<tool_call>hello there</tool_call>", "expected a tool name"),
])
def test_malformed_turns_say_why(chat, text, why):
    turn = _parse(chat, text)
    assert turn.calls == () and turn.error is not None and why in turn.error


def test_stray_control_token_and_call_limit(chat):
    ids = chat.tok.encode("hi") + list(chat.rendering.obs_open) + [chat.end_id]
    assert "stray" in parse_turn(chat, ids, 8).error
    many = "".join('<tool_call>{"name": "wait_for_messages"}</tool_call>' for _ in range(3))
    assert "3 calls in one turn" in _parse(chat, many, max_calls=2).error
    listed = '<tool_call>[' + ", ".join(['{"name": "a"}'] * 3) + "]</tool_call>"
    assert "3 calls in one turn" in _parse(chat, listed, max_calls=2).error


def test_role_card_teaches_the_format():
    card = role_card(agent="ceo", title="CEO", role="", task="t", brief="", roster=[("ceo", "CEO")],
                     subscriptions=[], budget_left=2, commitments="", tools=[],
                     style=PromptStyle.FULL, json_calls=True)
    assert JSON_CALL_FORMAT in card
