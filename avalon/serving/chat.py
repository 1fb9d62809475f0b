"""Chat messages to token ids and completions back to messages, for the OpenAI-compatible server.

Rendering. A tokenizer with a chat template (a GGUF file's, an HF directory's) renders the
request's messages through the template itself: every message's content is replaced by a
sentinel, the template is rendered (`avalon/tokenizer/template.py`, sandboxed as transformers
does), and the text between sentinels is markup, tokenized with the vocabulary's specials
recognised, while each content is tokenized as text (`HFTokenizer.encode`: a user who writes
"<|im_end|>" gets those characters, never the control token). For ChatML that is exactly the
organisation's layout (`avalon/tokenizer/chat.py`: system, then `<|im_end|>\\n<|im_start|>user\\n`
... `<|im_start|>assistant\\n` before each sampled output), so a conversation the server serves
has the ids an agent's context has. A tokenizer without a template (the byte and word
tokenizers of toy runs) lays messages out in the native format (`ChatFormat`).

Tools. A template that names `tools` gets the request's tool list as the variable of that name
(Qwen, Hermes, Llama 3 templates). A template without (SmolLM2's ChatML) gets them the way
instruction-tuned models were taught to read them: a `<tools>` block, and how to call one, at
the start of the system message. Calls are read back from the completion's text between
`<tool_call>` markers, JSON `{"name": ..., "arguments": {...}}` (the format both ways teach);
a call that does not parse leaves the text as content.

No re-tokenisation. An assistant message the server itself produced comes back in the next
request as text; re-encoding that text need not give the ids that were sampled. `SampledIds`
remembers, for each completion, the ids it sampled keyed by the ids before it and the message
as returned (content and calls), and the renderer puts those ids back. The KV a conversation
left in its slot then matches the next request's prefix token for token (`scheduler.py`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Sequence

from avalon.tokenizer import template as chat_template
from avalon.tokenizer.chat import ChatFormat, split_text_calls

CALL_OPEN, CALL_CLOSE = chat_template.TOOL_CALL, chat_template.TOOL_CALL_CLOSE
SENTINEL = "\x00AVALON{}\x00"
TOOLS_PREAMBLE = (
    "You may call one or more functions to assist with the user query. The functions are "
    "listed in <tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call a function, write a JSON "
    "object with its name and arguments between <tool_call></tool_call> tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as the API sends it


@dataclasses.dataclass(frozen=True)
class Message:
    """One validated request message (`protocol.py` builds these)."""

    role: str  # system | user | assistant | tool
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


def _message_key(content: str | None, calls: Sequence[ToolCall]) -> str:
    return json.dumps([content or "", [[c.name, c.arguments] for c in calls]])


class SampledIds:
    """Sampled ids, and whether they ended with the stop token, by (ids before them, message
    as returned); the oldest are forgotten past `capacity` entries."""

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._ids: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()

    @staticmethod
    def _key(prefix: Sequence[int], content: str | None, calls: Sequence[ToolCall]) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        h.update(json.dumps(list(map(int, prefix))).encode())
        h.update(_message_key(content, calls).encode())
        return h.digest()

    def put(self, prefix, content, calls, ids, ended: bool = True) -> None:
        key = self._key(prefix, content, calls)
        self._ids[key] = (tuple(int(i) for i in ids), ended)
        self._ids.move_to_end(key)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def get(self, prefix, content, calls) -> tuple[tuple[int, ...], bool] | None:
        """(ids, ended with the stop token) or None."""
        return self._ids.get(self._key(prefix, content, calls))


def calls_text(calls: Sequence[ToolCall]) -> str:
    """Calls as the model writes them (one `<tool_call>` block per call)."""
    out = []
    for c in calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = c.arguments
        out.append(f"{CALL_OPEN}\n{json.dumps({'name': c.name, 'arguments': args})}\n"
                   f"{CALL_CLOSE}")
    return "\n".join(out)


def parse_completion(text: str) -> tuple[str | None, tuple[ToolCall, ...]]:
    """(content, tool calls) of a completion's text. Text before the first call is the
    content; a call that is not a JSON object with a string `name` keeps the whole text as
    content and no calls (nothing a model writes raises)."""
    head, bodies = split_text_calls(text, CALL_OPEN, CALL_CLOSE)
    if not bodies:
        return text, ()
    calls = []
    for body in bodies:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return text, ()
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, ()
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"],
                              arguments=args if isinstance(args, str) else json.dumps(args)))
    head = head.strip()
    return (head or None), tuple(calls)


class ChatRenderer:
    """Messages (+ tools) -> prompt ids; see the module docstring."""

    def __init__(self, chat: ChatFormat, sampled: SampledIds | None = None, *,
                 open_cut_answers: bool = False):
        self.chat = chat
        # An answer cut at max_tokens ends without the end-of-turn token. The template closes
        # every assistant message (the default, as other servers render it); open, the
        # conversation continues from the ids the model has, as Avalon's organisation
        # continues an agent whose turn was cut (`avalon/org/context.py`).
        self.open_cut_answers = open_cut_answers
        self.tok = chat.tok
        self.template = getattr(self.tok, "chat_template", None)
        self.template_tools = self.template is not None and "tools" in self.template
        self.sampled = SampledIds() if sampled is None else sampled
        self.stop_ids = (chat.end_id,)

    # ---- prompts ---------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Sequence[dict] = ()) -> list[int]:
        """The prompt ids, ending with the generation prompt (the model answers next)."""
        if self.template is None:
            return self._render_native(messages, tools)
        return self._render_template(list(messages), list(tools))

    def _with_tools_preamble(self, messages: list[Message], tools: list[dict]) -> list[Message]:
        block = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(t) for t in tools))
        if messages and messages[0].role == "system":
            first = messages[0]
            text = block + ("\n\n" + first.content if first.content else "")
            return [dataclasses.replace(first, content=text)] + messages[1:]
        return [Message("system", block)] + messages

    def _render_template(self, messages: list[Message], tools: list[dict]) -> list[int]:
        if tools and not self.template_tools:
            messages = self._with_tools_preamble(messages, tools)
        contents, dicts = [], []
        for i, m in enumerate(messages):
            text = m.content or ""
            if m.role == "assistant" and m.tool_calls and not self.template_tools:
                text = (text + "\n" if text else "") + calls_text(m.tool_calls)
            contents.append(text)
            d = {"role": m.role, "content": SENTINEL.format(i)}
            if m.tool_calls and self.template_tools:
                d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.name, "arguments": json.loads(c.arguments)}} for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
            dicts.append(d)
        variables = {"tools": tools or None} if self.template_tools else {}
        text = chat_template.render(self.template, dicts, add_generation_prompt=True,
                                    **variables)
        ids: list[int] = []
        pos, open_answer = 0, False
        for i, m in enumerate(messages):
            mark = SENTINEL.format(i)
            at = text.find(mark, pos)
            if at < 0:
                raise ValueError(f"messages[{i}]: the chat template does not show this "
                                 f"{m.role} message's content")
            ids += self._markup(text[pos:at], open_answer)
            stored = self.sampled.get(ids, m.content, m.tool_calls) \
                if m.role == "assistant" else None
            ids += list(stored[0]) if stored is not None else self.tok.encode(contents[i])
            open_answer = stored is not None and not stored[1] and self.open_cut_answers
            pos = at + len(mark)
        ids += self._markup(text[pos:], open_answer)
        return ids

    def _markup(self, text: str, after_open_answer: bool) -> list[int]:
        ids = self.tok.encode_markup(text)
        if after_open_answer and ids and ids[0] == self.chat.end_id:
            return ids[1:]  # the cut answer stays open (see __init__)
        return ids

    def _render_native(self, messages: Sequence[Message], tools: Sequence[dict]) -> list[int]:
        chat = self.chat
        msgs = list(messages)
        if tools:
            msgs = self._with_tools_preamble(msgs, list(tools))
        ids: list[int] = []
        if msgs and msgs[0].role == "system":
            ids += chat.system(msgs[0].content or "")
            msgs = msgs[1:]
        pending: list[str] = []
        r = chat.rendering
        for m in msgs:
            if m.role == "assistant":
                ids += [*r.sep, *r.obs_open, *self.tok.encode("\n".join(pending)), r.end,
                        *r.sep, *r.agent_open]
                pending = []
                stored = self.sampled.get(ids, m.content, m.tool_calls)
                if stored is not None:
                    keep_open = not stored[1] and self.open_cut_answers
                    ids += list(stored[0]) + ([] if keep_open else [r.end])
                else:
                    ids += chat.output(m.content or "", [])[:-1] + \
                        (self.tok.encode(("\n" if m.content else "") + calls_text(m.tool_calls))
                         if m.tool_calls else []) + [r.end]
            else:
                pending.append(m.content or "")
        return ids + chat.turn_prompt("\n".join(pending))

    # ---- completions -----------------------------------------------------------------------
    def completion(self, prompt: Sequence[int], ids: Sequence[int], *, tools: bool,
                   stop_strings: Sequence[str] = (),
                   ended: bool = True) -> tuple[str | None, tuple[ToolCall, ...]]:
        """(content, tool calls) of sampled ids (without the stop token; `ended`: it was
        sampled), the text cut before the first stop string; remembers the ids for the
        conversation's next request (only when the content is their whole text: an answer
        cut at a stop string is re-encoded when it returns)."""
        text = self.tok.decode(list(ids))
        cuts = [text.find(s) for s in stop_strings if s in text]
        whole = not cuts
        if cuts:
            text = text[:min(cuts)]
        content, calls = parse_completion(text) if tools else (text, ())
        if whole:
            self.sampled.put(prompt, content, calls, ids, ended)
        return content, calls
