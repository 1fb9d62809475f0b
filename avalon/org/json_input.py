"""JSON written by someone Avalon does not control: one parser, one rule for numbers, a bound
on the memory parsing takes.

Everything parsed from a model or a client goes through `loads`: a model's tool-call arguments
(`toolcall.py`) and every ORS request body (`avalon/envs/transport.py`). Its rule for numbers:
every number must be a finite double. NaN and Infinity are refused, and so is a literal that
overflows a double (`1e400`, `-1e999`) or an integer beyond the largest one (`10**309`): parsed,
such a number would stop the event log from being written (its writer refuses non-finite
values) or overflow a later `float()`. A refusal is a ValueError naming the number, which the
callers turn into a malformed turn or a 400; nesting too deep for Python's parser is one too.

`parsed_size_bound(raw)` is an upper bound on the memory `loads(raw)` takes (the decoded text,
every object it makes, their containers), computed from byte counts without parsing: a server
budgets a body by it before parsing, since a body of nested empty objects takes ~25x its size
in bytes once parsed (measured with tracemalloc: at most 80 bytes per JSON token on CPython
3.11, for `[[[...]]]`; `VALUE_BYTES` leaves room).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

LARGEST_INT = int(sys.float_info.max)  # an integer past it is not a finite double
_LARGEST_DIGITS = len(str(LARGEST_INT))
VALUE_BYTES = 128  # per JSON token (a value, a key): its object and its slot in a container
PARSE_BYTES = 8 << 10  # per parse: the decoder's own objects (2.2 KiB measured)
_TOKEN_MARKS = (b"{", b"[", b",", b":")  # each value or key follows one, or starts the text


def _show(text: str) -> str:
    return text if len(text) <= 24 else text[:24] + "..."


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {_show(text)} is not a finite double (numbers must be)")
    return value


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits <= _LARGEST_DIGITS:
        value = int(text)
        if abs(value) <= LARGEST_INT:
            return value
    raise ValueError(f"integer {_show(text)} is beyond the largest finite double (numbers "
                     "must be finite doubles)")


def _constant(name: str):
    raise ValueError(f"{name} is not allowed (numbers must be finite doubles)")


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads`, with every number a finite double (module docstring); a ValueError
    otherwise, deep nesting included."""
    try:
        return json.loads(text, parse_float=_float, parse_int=_int, parse_constant=_constant)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


def parsed_size_bound(raw: bytes | bytearray) -> int:
    """An upper bound, in bytes, on what `loads(raw)` allocates (module docstring): the
    decoded text and the strings' characters, at up to 4 bytes each unless `raw` is ASCII
    without `\\u` escapes (then 1), `VALUE_BYTES` per token, every `{`, `[`, `,` and `:`
    counted as one (those inside strings too: they only make the bound looser), and the
    decoder's own `PARSE_BYTES`."""
    n = len(raw)
    width = 1 if raw.isascii() and b"\\u" not in raw else 4
    tokens = 1 + sum(raw.count(mark) for mark in _TOKEN_MARKS)
    return PARSE_BYTES + 2 * width * n + VALUE_BYTES * tokens
