"""Property (hypothesis): whatever JSON a model writes in a tool call (numbers of any size and
form, `1e400` and 400-digit integers included; strings with any escape, lone surrogates
included; any nesting, past the parser's recursion limit included), through the real
`RolloutDriver` with the event log written as a training run writes it, the driver never
raises, the episode ends, and the event log is written whole.

The organisation's own tools are called with their real parameter names half of the time, so
the values reach the handlers, not only the parser. Derandomized and bounded, so the default
suite stays fast; `-m slow` plays ten times as many.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from avalon.org.tools import SPECS
from avalon.org.workspace import WorkspaceLimits
from experiments.security.play import BareEnv, play

LIMITS = WorkspaceLimits(run_timeout_s=2.0, max_total_bytes=1 << 20, max_files=64)
FAST = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOOLS = sorted(SPECS.values(), key=lambda s: s.name)

# JSON number literals as a model may write them: any sign, digits, fraction and exponent.
numbers = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,4})?",
                  fullmatch=True),
    st.sampled_from(["1e400", "-1e999", "1E+309", "1e-400", "-0", "-0.0", "9" * 400,
                     "1" + "0" * 308, "2" + "0" * 308, "4.9e-324", "1.7976931348623157e308",
                     "1.7976931348623159e308", "0.1e-999999"]))


def _string(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)


strings = st.one_of(
    st.builds(_string, st.text(max_size=30), st.booleans()),
    st.sampled_from(['"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', '"a\\u202eb"', '""',
                     '"seq:\\u00b2"', '"' + "x" * 3000 + '"']))
scalars = st.one_of(numbers, strings, st.sampled_from(["true", "false", "null"]))


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"


values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(_array),
                            st.lists(st.tuples(strings, inner), max_size=4).map(_object)),
    max_leaves=12)
deep = st.builds(lambda n, v: "[" * n + v + "]" * n, st.integers(1, 3000), scalars)


@st.composite
def call_text(draw) -> str:
    """One call's text: a tool, then an object of its parameters (or any keys) with any
    values, written as raw JSON text."""
    spec = draw(st.sampled_from(TOOLS))
    names = [json.dumps(p.name) for p in spec.params]
    keys = st.one_of(st.sampled_from(names), strings) if names else strings
    pairs = draw(st.lists(st.tuples(keys, st.one_of(values, deep)), max_size=4))
    return f"{spec.name} {_object(pairs)}"


def _check(tmp, turns: list[list[str]]) -> None:
    logs = tmp / "logs"
    hire = 'hire {"title": "Dev", "role": "x", "tools": ["read_file", "write_file"]}'
    played = play(tmp, BareEnv(), {"ceo": [["roster"], [hire], *turns, ["wait_for_messages"]],
                                   "a1": turns[::-1]},
                  limits=LIMITS, budget=1, timeout_s=120.0, log_dir=logs)
    assert played.crash == "", played.crash
    assert any(e["kind"] == "end" for e in played.events)
    (log,) = logs.glob("*.jsonl")  # written: the writer refuses any non-finite number
    assert [json.loads(line)["seq"] for line in log.read_text().splitlines()] == \
        [e["seq"] for e in played.events]


KNOWN = [['roster {"n": 1e400}'], ['dm {"to": "a1", "text": "x", "n": [-1e999]}'],
         [f'read_file {{"path": {"9" * 400}}}'], ['post {"channel": "' + "[" * 2000 + '"}']]


def _property(examples: int, tmp_path_factory) -> None:
    @settings(FAST, max_examples=examples)
    @given(st.lists(st.lists(call_text(), min_size=1, max_size=2), min_size=1, max_size=4))
    @example(KNOWN)
    def check(turns):
        _check(tmp_path_factory.mktemp("calls"), turns)

    check()


def test_any_json_in_tool_calls_never_raises(tmp_path_factory):
    _property(30, tmp_path_factory)


@pytest.mark.slow
def test_any_json_in_tool_calls_never_raises_long(tmp_path_factory):
    _property(300, tmp_path_factory)
