"""What each organisation tool does: one handler per `OrgTool`, registered in `HANDLERS`.

A handler is a function of the organisation as it stands (`OrgState`, read only), the caller's
id and the call's arguments (already checked against the tool's `Param`s). It validates, raising
`ToolError` for a bad call, and returns a `ToolResult`: the text the caller sees and the effects
(`tools.py`) the organisation applies after logging the `tool_call`. Handlers change nothing
themselves, except the workspace's files (`write_file`, `run_code`): the workspace is a resource
the file tools use, as an environment tool uses its session.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from avalon.org.channels import Message, MessageKind, PostOffice
from avalon.org.errors import ToolError
from avalon.org.names import name_problem
from avalon.org.prompts import keep_improving
from avalon.org.tools import (
    ArchiveWrite,
    CountTraceRead,
    Finish,
    Fire,
    Hire,
    OpenChannel,
    OrgTool,
    Park,
    PinReport,
    Send,
    Subscribe,
    ToolResult,
)

if TYPE_CHECKING:
    from avalon.org.agents import Agent
    from avalon.org.config import OrgConfig
    from avalon.org.env import Task
    from avalon.org.events import EventLog
    from avalon.org.workspace import Workspace
    from avalon.tokenizer.chat import ChatFormat

ARCHIVE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# An event seq in evidence: ASCII digits only (`str.isdigit` also accepts '²', which `int`
# refuses) and short enough for `int` (which refuses over 4,300 digits).
EVIDENCE_SEQ = re.compile(r"[0-9]{1,12}")
MAX_TITLE_CHARS = 80
MAX_EMOJI_CHARS = 16


class OrgState(Protocol):
    """What a handler reads of the organisation (`Organisation` is one). Read only: a handler
    that must change something returns an effect."""

    config: OrgConfig
    task: Task
    chat: ChatFormat  # the organisation's (plain text) chat format
    budget: int
    hires: int
    tokens_out: int  # sampled by the whole organisation so far
    agents: Mapping[str, Agent]
    post: PostOffice
    log: EventLog
    workspace: Workspace
    archive: Mapping[str, str]
    archive_seq: Mapping[str, int]  # key -> the tool_call that wrote it
    file_seq: Mapping[str, int]  # Workspace.key -> the tool_call that wrote it

    def grantable_tools(self) -> tuple[str, ...]: ...

    def newest(self, seqs: Iterable[int]) -> int | None: ...


Handler = Callable[[OrgState, str, dict], ToolResult]


def _text(args: dict, name: str, *, allow_empty: bool = False) -> str:
    value = args.get(name, "")
    if not allow_empty and not value.strip():
        raise ToolError(f"{name} must not be empty")
    return value


def _active(org: OrgState, agent: str) -> bool:
    t = org.agents.get(agent)
    return t is not None and t.active


def _hire(org: OrgState, caller: str, args: dict) -> ToolResult:
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
    return ToolResult(f"hired {new_id} ({title})", effects=(Hire(new_id, title, role, chosen),))


def _fire(org: OrgState, caller: str, args: dict) -> ToolResult:
    target = args["agent"]
    if target == "ceo":
        raise ToolError("the CEO cannot be fired")
    if target == caller:
        raise ToolError("you cannot fire yourself")
    if not _active(org, target):
        raise ToolError(f"no active agent {target!r}")
    return ToolResult(f"fired {target}", effects=(Fire(target),))


def _create_channel(org: OrgState, caller: str, args: dict) -> ToolResult:
    key = org.post.new_channel_key(args["name"])
    return ToolResult(f"created {key}", effects=(OpenChannel(key, args.get("topic", "")),))


def _subscribe(org: OrgState, caller: str, args: dict) -> ToolResult:
    key, sub = org.post.subscription(args["channel"], args["mode"])
    return ToolResult(f"{key} {sub.value}", effects=(Subscribe(key, sub),))


def _post(org: OrgState, caller: str, args: dict) -> ToolResult:
    key = org.post.existing(args["channel"])
    text = _text(args, "text")
    mid = org.post.next_id()
    return ToolResult(f"sent {mid}", effects=(Send(mid, MessageKind.POST, text, channel=key),))


def _dm(org: OrgState, caller: str, args: dict) -> ToolResult:
    to = args["to"]
    if not _active(org, to):
        raise ToolError(f"no active agent {to!r}")
    if to == caller:
        raise ToolError("that is you")
    text = _text(args, "text")
    mid = org.post.next_id()
    return ToolResult(f"sent {mid}", effects=(Send(mid, MessageKind.DM, text, to=to),))


def _visible(org: OrgState, caller: str, mid: str) -> Message:
    m = org.post.messages.get(mid)
    if m is None or (m.kind is not MessageKind.POST and caller not in (m.sender, m.to)):
        raise ToolError(f"no message {mid!r} you can see")
    return m


def _react(org: OrgState, caller: str, args: dict) -> ToolResult:
    target = _visible(org, caller, args["message_id"])
    emoji = _text(args, "emoji").strip()
    if len(emoji) > MAX_EMOJI_CHARS:
        raise ToolError(f"emoji is {len(emoji)} characters; the limit is {MAX_EMOJI_CHARS}")
    problem = name_problem(emoji, allow_joiner=True)
    if problem is not None:
        raise ToolError(f"emoji {emoji!r}: {problem}")
    mid = org.post.next_id()
    return ToolResult(f"reacted {emoji}", effects=(
        Send(mid, MessageKind.REACTION, emoji, target=target.id),))


def _check_evidence(org: OrgState, caller: str, item) -> None:
    if not isinstance(item, str):
        raise ToolError("evidence items are strings: seq:N, file:PATH or archive:KEY")
    kind, _, ref = item.partition(":")
    if kind == "seq":
        events = org.log.events
        n = int(ref) if EVIDENCE_SEQ.fullmatch(ref) else -1
        ok = (0 <= n < len(events) and events[n]["kind"] == "tool_call"
              and events[n]["agent"] == caller and not events[n]["error"])
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


def _report(org: OrgState, caller: str, args: dict) -> ToolResult:
    evidence = args.get("evidence", [])
    for item in evidence:
        _check_evidence(org, caller, item)
    fields = {k: args[k] for k in ("status", "done", "blocked", "next") if args.get(k)}
    text = "; ".join(f"{k}: {v}" for k, v in fields.items())
    if evidence:
        text += "; evidence: " + ", ".join(evidence)
    mid = org.post.next_id()
    return ToolResult(f"sent {mid}", effects=(
        PinReport(fields), Send(mid, MessageKind.REPORT, text, to="ceo")))


def _read_message(org: OrgState, caller: str, args: dict) -> ToolResult:
    m = _visible(org, caller, args["message_id"])
    where = m.channel or m.kind.value
    return ToolResult(f"{where} {m.sender} {m.id}: {m.text}", content_seq=m.send_seq)


def _read_channel(org: OrgState, caller: str, args: dict) -> ToolResult:
    key = org.post.existing(args["channel"])
    last = args.get("last", 10)
    if not 1 <= last <= 100:
        raise ToolError(f"last must be 1..100, got {last}")
    ids = org.post.channels[key][-last:]
    msgs = [org.post.messages[i] for i in ids]
    return ToolResult("\n".join(f"{m.sender} {m.id}: {m.text}" for m in msgs) or "(empty)",
                      content_seq=org.newest(m.send_seq for m in msgs))


def _roster(org: OrgState, caller: str, args: dict) -> ToolResult:
    return ToolResult("; ".join(f"{x.id} {x.title} ({x.state.value})"
                                for x in org.agents.values()))


def _read_trace(org: OrgState, caller: str, args: dict) -> ToolResult:
    t = org.agents.get(args["agent"])
    if t is None:
        raise ToolError(f"no agent {args['agent']!r}")
    trace = t.context.trace
    start = args.get("start", 0)
    if not 0 <= start <= len(trace):
        raise ToolError(f"start must be 0..{len(trace)}, got {start}")
    end = min(len(trace), start + org.config.trace_read_tokens)
    body = org.chat.tok.decode(trace[start:end])
    return ToolResult(f"trace {t.id} tokens {start}-{end} of {len(trace)}:\n{body}",
                      effects=(CountTraceRead(),), content_seq=t.trace_seq(end))


def _wait(org: OrgState, caller: str, args: dict) -> ToolResult:
    return ToolResult("waiting", effects=(Park(),))


def _archive_write(org: OrgState, caller: str, args: dict) -> ToolResult:
    key, text = args["key"], args["text"]
    if not ARCHIVE_KEY.fullmatch(key):
        raise ToolError(f"archive key {key!r}: 1-64 of [A-Za-z0-9_.-]")
    lim = org.config.workspace
    size = len(text.encode("utf-8", errors="replace"))
    total = sum(len(v.encode("utf-8", errors="replace")) for k, v in org.archive.items()
                if k != key)
    if size > lim.max_file_bytes or total + size > lim.max_total_bytes:
        raise ToolError("the archive is full (or the note too long)")
    return ToolResult(f"saved {key}", effects=(ArchiveWrite(key, text),))


def _archive_read(org: OrgState, caller: str, args: dict) -> ToolResult:
    if args["key"] not in org.archive:
        raise ToolError(f"no note {args['key']!r}")
    return ToolResult(org.archive[args["key"]], content_seq=org.archive_seq[args["key"]])


def _archive_list(org: OrgState, caller: str, args: dict) -> ToolResult:
    return ToolResult(" ".join(org.archive) or "(empty)",
                      content_seq=org.newest(org.archive_seq.values()))


def _read_file(org: OrgState, caller: str, args: dict) -> ToolResult:
    text = org.workspace.read(args["path"])
    return ToolResult(text, content_seq=org.file_seq.get(org.workspace.key(args["path"])))


def _write_file(org: OrgState, caller: str, args: dict) -> ToolResult:
    n = org.workspace.write(args["path"], args["text"])
    key = org.workspace.key(args["path"])
    return ToolResult(f"wrote {n} bytes", wrote=(key,))


def _list_files(org: OrgState, caller: str, args: dict) -> ToolResult:
    names = org.workspace.listdir(args.get("path", "."))
    return ToolResult("\n".join(names) or "(empty)",
                      content_seq=org.newest(org.file_seq[n] for n in names if n in org.file_seq))


def _run_code(org: OrgState, caller: str, args: dict) -> ToolResult:
    r = org.workspace.run_python(args["path"], tuple(args.get("args", [])))
    status = "timed out" if r.timed_out else f"exit {r.returncode}"
    if r.caps_broken:
        status += (f"; it broke the workspace caps ({r.caps_broken}), so everything it created "
                   "or changed was removed")
    text = f"{status}\n{r.stdout}" + (f"\nstderr:\n{r.stderr}" if r.stderr else "")
    # Which files the program read is not known, so running it moves no clock (latency.py).
    return ToolResult(text, error=r.timed_out or r.returncode != 0 or bool(r.caps_broken),
                      duration_s=r.duration_s, measured=True, wrote=r.changed)


def _final_message(org: OrgState, caller: str, args: dict) -> ToolResult:
    text = _text(args, "text")
    needed = org.task.submit_after_tokens  # the S8 baseline's gate (org/env.py Task)
    if org.tokens_out < needed:
        raise ToolError(keep_improving(org.tokens_out, needed))
    return ToolResult("done", effects=(Finish(text),))


HANDLERS: dict[OrgTool, Handler] = {
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
