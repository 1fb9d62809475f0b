"""The tool-call text format, and the parser that turns a sampled output into calls.

An agent's output (see `avalon/tokenizer/chat.py` for the token layout) is free text followed
by zero or more calls, then `<|end|>`:

    FREE TEXT<|call|>NAME {JSON OBJECT}<|call|>NAME<|end|>

Each call is the special token `<|call|>`, a tool name (`[a-z][a-z0-9_]*`), and optionally one
JSON object of arguments (omitted = no arguments); whitespace around them is ignored, nothing
else may follow the object. Calls run in order. Example (a CEO's first turn):

    Two parts, two people.<|call|>create_channel {"name":"plan"}<|call|>hire {"title":"Lead
    Engineer","role":"build the parser","tools":["write_file","run_code"]}<|end|>

Malformed turn (every sampled token flagged MALFORMED, none of its calls run, the agent is told
why): a special token other than `<|call|>` before the final `<|end|>`, more calls than the
limit, a call without a valid name, JSON that does not parse or is not an object, a number that
is not a finite double (NaN, Infinity, `1e400`, `10**309`: `json_input.py`'s rule). A call
that parses but names an unknown tool, breaks a rule or fails is a tool error
(`avalon/org/tools.py`), not a parse failure. A turn cut by the token limit is parsed as it
stands: a cut call usually fails to parse.

With text calls (`ChatFormat.json_calls`, a pretrained vocabulary without a call token) each
call is a JSON object between `<tool_call>` markers, the convention instruction-tuned models
learnt (`{"name": "hire", "arguments": {...}}`; "parameters" is read as "arguments", and a
JSON list of such objects is several calls). The native grammar `NAME {JSON}` is accepted there
too, so a model that writes either is understood; anything else is malformed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from avalon.org import json_input
from avalon.tokenizer.chat import ChatFormat

_CALL = re.compile(r"\s*([a-z][a-z0-9_]*)\s*(\{.*\})?\s*", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Call:
    name: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    text: str  # the free text before the first call
    calls: tuple[Call, ...]
    error: str | None  # why the turn is malformed, or None
    ended: bool  # the output ended with `<|end|>` (not cut by a limit)


def _json_call(obj) -> tuple[Call | None, str | None]:
    """A `{"name": ..., "arguments": {...}}` object -> (call, None) or (None, error)."""
    if not isinstance(obj, dict):
        return None, "a call must be a JSON object with \"name\" and \"arguments\""
    name = obj.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        shown = repr(name)[:40]
        return None, f"\"name\" must be a tool name ([a-z][a-z0-9_]*), got {shown}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json_input.loads(args)
        except ValueError as e:
            return None, f"{name}: arguments are not valid JSON ({str(e)[:80]})"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"{name}: arguments must be a JSON object"
    return Call(name, args), None


def parse_calls(text: str) -> tuple[list[Call], str | None]:
    """One call block's text -> (calls, None) or ([], error): the native `NAME {JSON}`, or a
    JSON call object, or a JSON list of them (text calls)."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            obj = json_input.loads(stripped)
        except ValueError as e:
            return [], f"the call is not valid JSON ({str(e)[:80]})"
        calls = []
        for item in obj if isinstance(obj, list) else [obj]:
            call, error = _json_call(item)
            if error is not None:
                return [], error
            calls.append(call)
        if not calls:
            return [], "an empty list of calls"
        return calls, None
    call, error = parse_call(text)
    return ([call] if call is not None else []), error


def parse_call(text: str) -> tuple[Call | None, str | None]:
    """One call's text (after `<|call|>`) -> (call, None) or (None, error)."""
    m = _CALL.fullmatch(text)
    if m is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        return None, f"expected a tool name and an optional JSON object, got {shown!r}"
    name, raw = m.group(1), m.group(2)
    if raw is None:
        return Call(name, {}), None
    try:
        args = json_input.loads(raw)
    except ValueError as e:
        return None, f"{name}: arguments are not valid JSON ({str(e)[:80]})"
    if not isinstance(args, dict):
        return None, f"{name}: arguments must be a JSON object"
    return Call(name, args), None


def parse_turn(chat: ChatFormat, output: Sequence[int], max_calls: int) -> ParsedTurn:
    """Splits and parses a sampled output; never raises."""
    parts = chat.split_output(output)
    if parts.error is not None:
        return ParsedTurn(parts.text, (), parts.error, parts.ended)
    if len(parts.calls) > max_calls:
        return ParsedTurn(parts.text, (), f"{len(parts.calls)} calls in one turn; the limit is "
                          f"{max_calls}", parts.ended)
    calls: list[Call] = []
    for i, text in enumerate(parts.calls):
        if chat.json_calls:
            found, error = parse_calls(text)
        else:
            call, error = parse_call(text)
            found = [call]
        if error is not None:
            return ParsedTurn(parts.text, (), f"call {i + 1}: {error}", parts.ended)
        calls += found
    if len(calls) > max_calls:  # a JSON list holds several
        return ParsedTurn(parts.text, (), f"{len(calls)} calls in one turn; the limit is "
                          f"{max_calls}", parts.ended)
    return ParsedTurn(parts.text, tuple(calls), None, parts.ended)


def format_call(name: str, args: Mapping[str, Any] | None = None, *,
                json_call: bool = False) -> str:
    """The text of one call (what follows `<|call|>`), compact JSON, no arguments = bare name;
    with `json_call` (text calls) the JSON object `{"name": ..., "arguments": {...}}`."""
    if json_call:
        return json.dumps({"name": name, "arguments": dict(args or {})}, ensure_ascii=False)
    if not args:
        return name
    return name + " " + json.dumps(dict(args), separators=(",", ":"), ensure_ascii=False)
