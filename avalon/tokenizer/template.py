"""A tokenizer's own chat template as the organisation's `Rendering`.

A Hugging Face checkpoint directory ships its template in `tokenizer_config.json`
(`chat_template`: a string, or a list of `{name, template}` of which "default" is used) or in
`chat_template.jinja`. The template is rendered (Jinja2, sandboxed, as transformers renders it)
over probe conversations whose contents are sentinels; the text around the sentinels is the
markup of each role:

    render([system S])                               -> SYSTEM_OPEN S END SEP
    render([system S, user U], generation prompt)    -> ... END SEP USER_OPEN U END SEP AGENT_OPEN
    render([system S, user U, assistant A])          -> ... AGENT_OPEN' A END SEP

`END` must be one special token of the vocabulary (`<|im_end|>` for ChatML-style templates:
the engine stops on it); the three turn endings must agree. Each opening and `SEP` are
tokenized with the vocabulary's special tokens recognised (markup), while message text never is
(`HFTokenizer.encode`). The agent's opening is the generation prompt's (what the model answers
after at inference, e.g. `<|im_start|>assistant\\n<think></think>` for a template that turns
thinking off that way).

Tool calls: the tokenizer's `<tool_call>` and `</tool_call>` tokens when its vocabulary has
them (the Nemotron and Qwen templates' markers); the call text between them keeps Avalon's
grammar (`NAME {JSON}`, `avalon/org/toolcall.py`), which the template's own argument layout is
not asked to match. A vocabulary without `<tool_call>` gets one new special, `<|call|>`.
"""

from __future__ import annotations

import dataclasses
import json
import os

SENTINELS = {"system": "SYSTEMSENTINEL", "user": "USERSENTINEL",
             "assistant": "ASSISTANTSENTINEL"}
TOOL_CALL, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class TemplateError(ValueError):
    """A chat template whose turns cannot be split into role markup."""


@dataclasses.dataclass(frozen=True)
class Markup:
    """The strings of a template's role markup (see the module docstring)."""

    system_open: str
    obs_open: str
    agent_open: str
    end: str  # one special token
    sep: str


def read_template(path: str | os.PathLike) -> str | None:
    """The chat template of a checkpoint directory, or None if it ships none."""
    path = os.fspath(path)
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja) as f:
            return f.read()
    config = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        template = json.load(f).get("chat_template")
    if isinstance(template, list):
        by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = by_name.get("default")
    return template if isinstance(template, str) and template else None


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = False,
           **variables) -> str:
    """`template` over `messages`, in a sandbox (transformers' Jinja2 settings)."""
    from jinja2.exceptions import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages,
                                                add_generation_prompt=add_generation_prompt,
                                                **variables)
    except JinjaError as e:
        raise TemplateError(f"chat template does not render: {e}") from None


def _around(text: str, sentinel: str, what: str) -> tuple[str, str]:
    if text.count(sentinel) != 1:
        raise TemplateError(f"chat template: the {what} content appears {text.count(sentinel)} "
                            "times in its rendering (expected once)")
    before, _, after = text.partition(sentinel)
    return before, after


def markup(template: str, is_special) -> Markup:
    """Split `template`'s turns into role markup; `is_special(text) -> bool` says whether a
    string is one special token of the vocabulary (the end of turn must be)."""
    s, u, a = SENTINELS["system"], SENTINELS["user"], SENTINELS["assistant"]
    system = [{"role": "system", "content": s}]
    user = system + [{"role": "user", "content": u}]
    one = render(template, system)
    prompt = render(template, user, add_generation_prompt=True)
    full = render(template, user + [{"role": "assistant", "content": a}])
    system_open, after_system = _around(one, s, "system")
    if not prompt.startswith(system_open + s):
        raise TemplateError("chat template: the system turn renders differently before a user "
                            "turn")
    between, after_user = _around(prompt[len(system_open) + len(s):], u, "user")
    _, after_agent = _around(full, a, "assistant")
    closing = after_agent  # END SEP, the way an agent's turn ends
    if after_system != closing or not between.startswith(closing) or \
            not after_user.startswith(closing):
        raise TemplateError(f"chat template: turns end differently (system {after_system!r}, "
                            f"user {after_user[:len(closing)]!r}, assistant {closing!r})")
    end = next((closing[:n] for n in range(len(closing), 0, -1) if is_special(closing[:n])),
               None)
    if end is None:
        raise TemplateError(f"chat template: a turn ends with {closing!r}, which does not start "
                            "with a special token (the engine needs one stop token)")
    return Markup(system_open=system_open, obs_open=between[len(closing):],
                  agent_open=after_user[len(closing):], end=end, sep=closing[len(end):])
