"""The chat-completions request, validated: every refusal is an `ApiError` (a 4xx with the
OpenAI API's error object, naming the field and the value), never a traceback.

Accepted: `model`, `messages` (system / developer / user / assistant / tool; text content, a
string or a list of text parts), `tools` (functions), `tool_choice` ("auto" / "none"),
`stream` (+ `stream_options.include_usage`), `logprobs` (the sampled token's; `top_logprobs`
only 0: the engine returns no alternatives), `n`, `temperature` (0 = greedy), `top_p`, `seed`,
`max_tokens` / `max_completion_tokens`, `stop` (a string or up to 4), and Avalon's
`return_token_ids` (the prompt's and each choice's ids, as vLLM returns them). Fields the
server does not act on but clients send by default (`user`, `store`, `metadata`,
`parallel_tool_calls`, penalties at 0, ...) are ignored; anything else is refused rather than
silently dropped.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import secrets

from avalon.envs.transport import HttpError
from avalon.serving.chat import Message, ToolCall

SEED_LIMIT = 2 ** 32
MAX_N = 16
MAX_STOP = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
# Sent by common clients (openai, inspect-ai) and harmless to ignore.
IGNORED = frozenset({"user", "store", "metadata", "parallel_tool_calls", "service_tier",
                     "prompt_cache_key", "safety_identifier", "reasoning_effort", "modalities",
                     "stream_options", "logit_bias", "response_format", "prediction"})


class ApiError(HttpError):
    """A refusal in the OpenAI API's terms: HTTP status, error type, code, param, message."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(status, kind, message)
        self.param, self.code = param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


def bad(param: str, value, why: str) -> ApiError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ApiError(400, f"{param}={shown}: {why}", param=param, code="invalid_value")


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict, ...]
    stream: bool
    include_usage: bool
    logprobs: bool
    n: int
    temperature: float  # 0 = greedy
    top_p: float
    seed: int
    max_tokens: int | None
    stop: tuple[str, ...]
    return_token_ids: bool


def _int(body: dict, name: str, lo: int, hi: int | None = None, default=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or \
            (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad(name, v, f"must be an integer {rng}")
    return int(v)


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise bad(name, v, f"must be a number in [{lo}, {hi}]")
    return float(v)


def _top_p(body: dict) -> float:
    p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if p == 0:
        raise bad("top_p", body["top_p"], "must be > 0 (use temperature=0 for greedy)")
    return p


def _content(i: int, m: dict) -> str | None:
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") != "text" or \
                    not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]", p, "only text parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content", c, "must be a string, a list of text parts or null")


def _tool_calls(i: int, m: dict) -> tuple[ToolCall, ...]:
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise bad(f"messages[{i}].tool_calls", calls, "must be a list")
    out = []
    for j, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad(where, c, "must be {id, type: function, function: {name, arguments}}")
        args = f.get("arguments", "{}")
        if not isinstance(args, str):
            raise bad(f"{where}.function.arguments", args, "must be a JSON string")
        out.append(ToolCall(id=str(c.get("id", "")), name=f["name"], arguments=args))
    return tuple(out)


def _messages(raw) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", raw, "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", m, "must be an object with a role")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role", role, f"must be one of {', '.join(ROLES)}")
        content = _content(i, m)
        calls = _tool_calls(i, m) if role == "assistant" else ()
        if content is None and not calls:
            raise bad(f"messages[{i}].content", None, "is required (text) unless the "
                      "assistant message has tool_calls")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise bad(f"messages[{i}].name", name, "must be a string")
        call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise bad(f"messages[{i}].tool_call_id", call_id, "a tool message needs the "
                      "id of the call it answers")
        out.append(Message(role="system" if role == "developer" else role, content=content,
                           tool_calls=calls, tool_call_id=call_id if role == "tool" else None,
                           name=name))
    return tuple(out)


def _tools(body: dict) -> tuple[dict, ...]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("tools", tools, "must be a list of function tools")
    out = []
    for j, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise bad(f"tools[{j}]", t, "must be {type: function, function: {name, "
                      "description, parameters}}")
        params = f.get("parameters", {})
        if not isinstance(params, dict):
            raise bad(f"tools[{j}].function.parameters", params, "must be a JSON schema object")
        out.append({"type": "function", "function": {
            "name": f["name"], "description": str(f.get("description", "")),
            "parameters": params}})
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return ()
    if choice not in ("auto", None) and not (choice == "required" and out):
        raise bad("tool_choice", choice, "supported: auto, none (or required with tools)")
    return tuple(out)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP or \
            not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", stop, f"must be a non-empty string or a list of up to {MAX_STOP}")
    return tuple(stops)


KNOWN = frozenset({"model", "messages", "tools", "tool_choice", "stream", "logprobs",
                   "top_logprobs", "n", "temperature", "top_p", "seed", "max_tokens",
                   "max_completion_tokens", "stop", "return_token_ids", "frequency_penalty",
                   "presence_penalty"})


def parse_chat(body: dict, served: str) -> ChatRequest:
    """The validated request; an ApiError naming the first bad field."""
    unknown = sorted(set(body) - KNOWN - IGNORED)
    if unknown:
        raise bad(unknown[0], body[unknown[0]], "is not supported by this server")
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", model, "is required (a string: GET /v1/models lists it)")
    if model != served:
        raise ApiError(404, f"model={model!r}: this server serves {served!r}", param="model",
                       code="model_not_found")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise bad(name, body[name], "only 0 is supported")
    for name in ("stream", "logprobs", "return_token_ids"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise bad(name, body[name], "must be true or false")
    if _int(body, "top_logprobs", 0, 20, 0):
        raise bad("top_logprobs", body["top_logprobs"], "only 0 is supported: the engine "
                  "returns the sampled token's log-prob, not alternatives")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("stream_options", options, "must be an object")
    max_tokens = _int(body, "max_completion_tokens", 1)
    max_tokens = _int(body, "max_tokens", 1, default=max_tokens)
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(SEED_LIMIT)
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise bad("seed", seed, "must be an integer")
    return ChatRequest(
        model=model, messages=_messages(body.get("messages")), tools=_tools(body),
        stream=bool(body.get("stream", False)),
        include_usage=bool(options.get("include_usage", False)),
        logprobs=bool(body.get("logprobs", False)), n=_int(body, "n", 1, MAX_N, 1),
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0), top_p=_top_p(body),
        seed=int(seed) % SEED_LIMIT,
        max_tokens=max_tokens, stop=_stop(body),
        return_token_ids=bool(body.get("return_token_ids", False)))
