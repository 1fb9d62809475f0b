"""The organisation's own tools: specs (what agents read) and handlers (what they do).

Who has which tool:
- the CEO: every tool below except `report_to_ceo`, and every environment tool;
- a specialist: the co-ordination tools (subscribe, post, dm, react, report_to_ceo,
  read_message, read_channel, roster, read_trace, wait_for_messages, archive_*) plus the tools
  granted at hire: any of the workspace tools (read_file, write_file, list_files, run_code) and
  the environment tools marked grantable. `Permissions` can give specialists hire, fire and
  create_channel, or take read_trace from everyone.
Plan mode (the CEO's first turn when `OrgConfig.plan_mode`): write_file, run_code,
final_message and environment tools are refused with a tool error.

A handler validates, then returns a `ToolResult`. Side effects that log events of their own
(a send, a hire, a fire, a wait) go in `ToolResult.effect`, which the organisation runs after
logging the `tool_call`, with its seq, so every event's cause comes before it. Handlers raise
`ToolError` for a bad call; the organisation turns it into a tool-error result.

Reading moves the reader's clock (`avalon/org/latency.py`): a handler whose result shows
teammates' content (messages, channels, traces, archive notes and names, workspace files and
names) sets `ToolResult.content_seq` to the event at which the newest of it existed, and the
organisation logs it on the `tool_call`. Writes are remembered for that: `archive_write` in
`Organisation.archive_seq`, `write_file` and the files a `run_code` program changed (`wrote`)
in `Organisation.file_seq`. `run_code` itself moves no clock: what the program read is unknown.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from avalon.org.channels import Message, MessageKind
from avalon.org.env import EnvReward, Param, ParamType, ToolError, ToolSpec
from avalon.org.names import name_problem
from avalon.org.prompts import keep_improving

if TYPE_CHECKING:
    from avalon.org.agents import Agent
    from avalon.org.organisation import Organisation

S, I, A = ParamType.STRING, ParamType.INTEGER, ParamType.ARRAY
ARCHIVE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# An event seq in evidence: ASCII digits only (`str.isdigit` also accepts '²', which `int`
# refuses) and short enough for `int` (which refuses over 4,300 digits).
EVIDENCE_SEQ = re.compile(r"[0-9]{1,12}")
MAX_TITLE_CHARS = 80
MAX_EMOJI_CHARS = 16


class OrgTool(enum.Enum):
    HIRE = "hire"
    FIRE = "fire"
    CREATE_CHANNEL = "create_channel"
    SUBSCRIBE = "subscribe"
    POST = "post"
    DM = "dm"
    REACT = "react"
    REPORT_TO_CEO = "report_to_ceo"
    READ_MESSAGE = "read_message"
    READ_CHANNEL = "read_channel"
    ROSTER = "roster"
    READ_TRACE = "read_trace"
    WAIT_FOR_MESSAGES = "wait_for_messages"
    ARCHIVE_WRITE = "archive_write"
    ARCHIVE_READ = "archive_read"
    ARCHIVE_LIST = "archive_list"
    READ_FILE = "read_file"
    WRITE_FILE = "write_file"
    LIST_FILES = "list_files"
    RUN_CODE = "run_code"
    FINAL_MESSAGE = "final_message"


_SPECS = (
    ToolSpec("hire", "add a specialist (same model, own context)", (
        Param("title", S, "job title"), Param("role", S, "what they should do"),
        Param("tools", A, "names of tools to grant"))),
    ToolSpec("fire", "remove a specialist", (Param("agent", S),)),
    ToolSpec("create_channel", "open a channel", (
        Param("name", S, "e.g. plan"), Param("topic", S, required=False))),
    ToolSpec("subscribe", "set your mode for a channel", (
        Param("channel", S), Param("mode", S, "full, light or muted"))),
    ToolSpec("post", "post to a channel; @id mentions reach anyone", (
        Param("channel", S), Param("text", S))),
    ToolSpec("dm", "message one teammate", (Param("to", S), Param("text", S))),
    ToolSpec("react", "react to a message (does not wake its author)", (
        Param("message_id", S), Param("emoji", S))),
    ToolSpec("report_to_ceo", "status report; evidence: seq:N, file:PATH or archive:KEY "
             "(checked)", (
        Param("status", S), Param("done", S, required=False),
        Param("blocked", S, required=False), Param("next", S, required=False),
        Param("evidence", A, required=False))),
    ToolSpec("read_message", "read one message in full", (Param("message_id", S),)),
    ToolSpec("read_channel", "read a channel's latest posts", (
        Param("channel", S), Param("last", I, "how many (default 10)", required=False))),
    ToolSpec("roster", "who is in the team"),
    ToolSpec("read_trace", "read a teammate's full context", (
        Param("agent", S), Param("start", I, "first token (default 0)", required=False))),
    ToolSpec("wait_for_messages", "sleep until a message arrives"),
    ToolSpec("archive_write", "save a note or plan", (
        Param("key", S), Param("text", S))),
    ToolSpec("archive_read", "read a note", (Param("key", S),)),
    ToolSpec("archive_list", "list notes"),
    ToolSpec("read_file", "read a workspace file", (Param("path", S),)),
    ToolSpec("write_file", "write a workspace file", (
        Param("path", S), Param("text", S))),
    ToolSpec("list_files", "list workspace files", (Param("path", S, required=False),)),
    ToolSpec("run_code", "run a workspace python file", (
        Param("path", S), Param("args", A, required=False))),
    ToolSpec("final_message", "the final answer; ends the task", (Param("text", S),)),
)
SPECS: dict[OrgTool, ToolSpec] = {OrgTool(s.name): s for s in _SPECS}

WORKSPACE_TOOLS = (OrgTool.READ_FILE, OrgTool.WRITE_FILE, OrgTool.LIST_FILES, OrgTool.RUN_CODE)
CEO_ONLY = (OrgTool.HIRE, OrgTool.FIRE, OrgTool.CREATE_CHANNEL, OrgTool.FINAL_MESSAGE)
PLAN_MODE_REFUSED = (OrgTool.WRITE_FILE, OrgTool.RUN_CODE, OrgTool.FINAL_MESSAGE)
NOT_COORDINATION = (*WORKSPACE_TOOLS, OrgTool.FINAL_MESSAGE)


@dataclasses.dataclass
class ToolResult:
    text: str
    error: bool = False
    duration_s: float = 0.0
    measured: bool = False
    rewards: tuple[EnvReward, ...] = ()
    terminal: bool = False
    effect: Callable[[int], None] | None = None  # run with the tool_call's seq, after logging
    # The event at which the newest teammates' content in `text` existed (latency.py: reading
    # moves the reader's clock up to its author's clock there); None when nothing was read.
    content_seq: int | None = None
    wrote: tuple[str, ...] = ()  # workspace files (`Workspace.key`) this call wrote, even failing


def _text(args: dict, name: str, *, allow_empty: bool = False) -> str:
    value = args.get(name, "")
    if not allow_empty and not value.strip():
        raise ToolError(f"{name} must not be empty")
    return value


def _hire(org: Organisation, a: Agent, args: dict) -> ToolResult:
    if org.hires >= org.budget:
        raise ToolError(f"budget {org.budget}: no hires left")
    title = _text(args, "title").strip()
    if len(title) > MAX_TITLE_CHARS:
        raise ToolError(f"title is {len(title)} characters; the limit is {MAX_TITLE_CHARS}")
    problem = name_problem(title)
    if problem is not None:  # a title is pinned in every teammate's role card and roster
        raise ToolError(f"title {title[:MAX_TITLE_CHARS]!r}: {problem}; a title is one line "
                        "of visible text")
    role = _text(args, "role", allow_empty=True)
    grantable = org.grantable_tools()
    tools = args["tools"]
    for t in tools:
        if t not in grantable:
            raise ToolError(f"cannot grant {t!r}; grantable: {', '.join(grantable)}")
    new_id = f"a{org.hires + 1}"
    chosen = tuple(dict.fromkeys(tools))
    return ToolResult(f"hired {new_id} ({title})",
                      effect=lambda seq: org.hire(seq, a, new_id, title, role, chosen))


def _fire(org: Organisation, a: Agent, args: dict) -> ToolResult:
    target = args["agent"]
    if target == "ceo":
        raise ToolError("the CEO cannot be fired")
    if target == a.id:
        raise ToolError("you cannot fire yourself")
    t = org.agents.get(target)
    if t is None or not t.active:
        raise ToolError(f"no active agent {target!r}")
    return ToolResult(f"fired {target}", effect=lambda seq: org.fire(seq, a, target))


def _create_channel(org: Organisation, a: Agent, args: dict) -> ToolResult:
    key = org.post.create_channel(args["name"], args.get("topic", ""))
    return ToolResult(f"created {key}")


def _subscribe(org: Organisation, a: Agent, args: dict) -> ToolResult:
    key, sub = org.post.subscribe(a.id, args["channel"], args["mode"])
    return ToolResult(f"{key} {sub.value}")


def _post(org: Organisation, a: Agent, args: dict) -> ToolResult:
    key = org.post.existing(args["channel"])
    text = _text(args, "text")
    mid = org.post.next_id()
    return ToolResult(f"sent {mid}", effect=lambda seq: org.send(
        seq, a, mid, MessageKind.POST, text, channel=key))


def _dm(org: Organisation, a: Agent, args: dict) -> ToolResult:
    to = args["to"]
    t = org.agents.get(to)
    if t is None or not t.active:
        raise ToolError(f"no active agent {to!r}")
    if to == a.id:
        raise ToolError("that is you")
    text = _text(args, "text")
    mid = org.post.next_id()
    return ToolResult(f"sent {mid}", effect=lambda seq: org.send(
        seq, a, mid, MessageKind.DM, text, to=to))


def _visible(org: Organisation, a: Agent, mid: str) -> Message:
    m = org.post.messages.get(mid)
    if m is None or (m.kind is not MessageKind.POST and a.id not in (m.sender, m.to)):
        raise ToolError(f"no message {mid!r} you can see")
    return m


def _react(org: Organisation, a: Agent, args: dict) -> ToolResult:
    target = _visible(org, a, args["message_id"])
    emoji = _text(args, "emoji").strip()
    if len(emoji) > MAX_EMOJI_CHARS:
        raise ToolError(f"emoji is {len(emoji)} characters; the limit is {MAX_EMOJI_CHARS}")
    problem = name_problem(emoji, allow_joiner=True)
    if problem is not None:
        raise ToolError(f"emoji {emoji!r}: {problem}")
    mid = org.post.next_id()
    return ToolResult(f"reacted {emoji}", effect=lambda seq: org.send(
        seq, a, mid, MessageKind.REACTION, emoji, target=target.id))


def _check_evidence(org: Organisation, a: Agent, item) -> None:
    if not isinstance(item, str):
        raise ToolError("evidence items are strings: seq:N, file:PATH or archive:KEY")
    kind, _, ref = item.partition(":")
    if kind == "seq":
        events = org.log.events
        n = int(ref) if EVIDENCE_SEQ.fullmatch(ref) else -1
        ok = (0 <= n < len(events) and events[n]["kind"] == "tool_call"
              and events[n]["agent"] == a.id and not events[n]["error"])
        if not ok:
            raise ToolError(f"evidence {item!r}: not a successful tool call of yours")
    elif kind == "file":
        if not org.workspace.exists(ref):
            raise ToolError(f"evidence {item!r}: no such workspace file")
    elif kind == "archive":
        if ref not in org.archive:
            raise ToolError(f"evidence {item!r}: no such archive note")
    else:
        raise ToolError(f"evidence {item!r}: use seq:N, file:PATH or archive:KEY")


def _report(org: Organisation, a: Agent, args: dict) -> ToolResult:
    evidence = args.get("evidence", [])
    for item in evidence:
        _check_evidence(org, a, item)
    fields = {k: args[k] for k in ("status", "done", "blocked", "next") if args.get(k)}
    text = "; ".join(f"{k}: {v}" for k, v in fields.items())
    if evidence:
        text += "; evidence: " + ", ".join(evidence)
    mid = org.post.next_id()

    def effect(seq: int) -> None:
        a.last_report = fields
        org.send(seq, a, mid, MessageKind.REPORT, text, to="ceo")

    return ToolResult(f"sent {mid}", effect=effect)


def _read_message(org: Organisation, a: Agent, args: dict) -> ToolResult:
    m = _visible(org, a, args["message_id"])
    where = m.channel or m.kind.value
    return ToolResult(f"{where} {m.sender} {m.id}: {m.text}", content_seq=m.send_seq)


def _read_channel(org: Organisation, a: Agent, args: dict) -> ToolResult:
    key = org.post.existing(args["channel"])
    last = args.get("last", 10)
    if not 1 <= last <= 100:
        raise ToolError(f"last must be 1..100, got {last}")
    ids = org.post.channels[key][-last:]
    msgs = [org.post.messages[i] for i in ids]
    return ToolResult("\n".join(f"{m.sender} {m.id}: {m.text}" for m in msgs) or "(empty)",
                      content_seq=org.newest(m.send_seq for m in msgs))


def _roster(org: Organisation, a: Agent, args: dict) -> ToolResult:
    return ToolResult("; ".join(f"{x.id} {x.title} ({x.state.value})"
                                for x in org.agents.values()))


def _read_trace(org: Organisation, a: Agent, args: dict) -> ToolResult:
    t = org.agents.get(args["agent"])
    if t is None:
        raise ToolError(f"no agent {args['agent']!r}")
    trace = t.context.trace
    start = args.get("start", 0)
    if not 0 <= start <= len(trace):
        raise ToolError(f"start must be 0..{len(trace)}, got {start}")
    end = min(len(trace), start + org.config.trace_read_tokens)
    a.stats.trace_reads += 1
    body = org.chat.tok.decode(trace[start:end])
    return ToolResult(f"trace {t.id} tokens {start}-{end} of {len(trace)}:\n{body}",
                      content_seq=t.trace_seq(end))


def _wait(org: Organisation, a: Agent, args: dict) -> ToolResult:
    return ToolResult("waiting", effect=lambda seq: org.park(seq, a))


def _archive_write(org: Organisation, a: Agent, args: dict) -> ToolResult:
    key, text = args["key"], args["text"]
    if not ARCHIVE_KEY.fullmatch(key):
        raise ToolError(f"archive key {key!r}: 1-64 of [A-Za-z0-9_.-]")
    lim = org.config.workspace
    size = len(text.encode("utf-8", errors="replace"))
    total = sum(len(v.encode("utf-8", errors="replace")) for k, v in org.archive.items()
                if k != key)
    if size > lim.max_file_bytes or total + size > lim.max_total_bytes:
        raise ToolError("the archive is full (or the note too long)")
    org.archive[key] = text
    return ToolResult(f"saved {key}", effect=lambda seq: org.archive_seq.__setitem__(key, seq))


def _archive_read(org: Organisation, a: Agent, args: dict) -> ToolResult:
    if args["key"] not in org.archive:
        raise ToolError(f"no note {args['key']!r}")
    return ToolResult(org.archive[args["key"]], content_seq=org.archive_seq[args["key"]])


def _archive_list(org: Organisation, a: Agent, args: dict) -> ToolResult:
    return ToolResult(" ".join(org.archive) or "(empty)",
                      content_seq=org.newest(org.archive_seq.values()))


def _read_file(org: Organisation, a: Agent, args: dict) -> ToolResult:
    text = org.workspace.read(args["path"])
    return ToolResult(text, content_seq=org.file_seq.get(org.workspace.key(args["path"])))


def _write_file(org: Organisation, a: Agent, args: dict) -> ToolResult:
    n = org.workspace.write(args["path"], args["text"])
    key = org.workspace.key(args["path"])
    return ToolResult(f"wrote {n} bytes", wrote=(key,))


def _list_files(org: Organisation, a: Agent, args: dict) -> ToolResult:
    names = org.workspace.listdir(args.get("path", "."))
    return ToolResult("\n".join(names) or "(empty)",
                      content_seq=org.newest(org.file_seq[n] for n in names if n in org.file_seq))


def _run_code(org: Organisation, a: Agent, args: dict) -> ToolResult:
    r = org.workspace.run_python(args["path"], tuple(args.get("args", [])))
    status = "timed out" if r.timed_out else f"exit {r.returncode}"
    if r.caps_broken:
        status += (f"; it broke the workspace caps ({r.caps_broken}), so everything it created "
                   "or changed was removed")
    text = f"{status}\n{r.stdout}" + (f"\nstderr:\n{r.stderr}" if r.stderr else "")
    # Which files the program read is not known, so running it moves no clock (latency.py).
    return ToolResult(text, error=r.timed_out or r.returncode != 0 or bool(r.caps_broken),
                      duration_s=r.duration_s, measured=True, wrote=r.changed)


def _final_message(org: Organisation, a: Agent, args: dict) -> ToolResult:
    text = _text(args, "text")
    needed = org.task.submit_after_tokens  # the S8 baseline's gate (org/env.py Task)
    if org.tokens_out < needed:
        raise ToolError(keep_improving(org.tokens_out, needed))
    return ToolResult("done", effect=lambda seq: org.finish_with_message(seq, text))


HANDLERS: dict[OrgTool, Callable[[Organisation, Agent, dict], ToolResult]] = {
    OrgTool.HIRE: _hire, OrgTool.FIRE: _fire, OrgTool.CREATE_CHANNEL: _create_channel,
    OrgTool.SUBSCRIBE: _subscribe, OrgTool.POST: _post, OrgTool.DM: _dm,
    OrgTool.REACT: _react, OrgTool.REPORT_TO_CEO: _report,
    OrgTool.READ_MESSAGE: _read_message, OrgTool.READ_CHANNEL: _read_channel,
    OrgTool.ROSTER: _roster, OrgTool.READ_TRACE: _read_trace,
    OrgTool.WAIT_FOR_MESSAGES: _wait, OrgTool.ARCHIVE_WRITE: _archive_write,
    OrgTool.ARCHIVE_READ: _archive_read, OrgTool.ARCHIVE_LIST: _archive_list,
    OrgTool.READ_FILE: _read_file, OrgTool.WRITE_FILE: _write_file,
    OrgTool.LIST_FILES: _list_files, OrgTool.RUN_CODE: _run_code,
    OrgTool.FINAL_MESSAGE: _final_message,
}
