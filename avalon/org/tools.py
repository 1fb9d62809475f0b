"""The organisation's own tools: specs (what agents read) and the effects a call has.

Who has which tool:
- the CEO: every tool below except `report_to_ceo`, and every environment tool;
- a specialist: the co-ordination tools (subscribe, post, dm, react, report_to_ceo,
  read_message, read_channel, roster, read_trace, wait_for_messages, archive_*) plus the tools
  granted at hire: any of the workspace tools (read_file, write_file, list_files, run_code) and
  the environment tools marked grantable. `Permissions` can give specialists hire, fire and
  create_channel, or take read_trace from everyone, or (`talk=False`) every tool of
  `TALK_TOOLS` from everyone.
Plan mode (the CEO's first turn when `OrgConfig.plan_mode`): write_file, run_code,
final_message and environment tools are refused with a tool error.

What a call does is data. A handler (`handlers.py`) reads the organisation through a narrow
view and returns a `ToolResult`: the text the caller sees and the *effects* below (a message
sent, a hire, a fire, a wait, the final message, a channel opened, a subscription, an archive
note, a report pinned, a trace read counted). The organisation logs the `tool_call`, then
applies the effects in order with its seq, so every event's cause comes before it and all
shared state changes at the call's commit on the clock (`schedule.py`). A bad call raises
`ToolError` in the handler, before any effect; the organisation turns it into a tool-error
result. The workspace is a resource the file tools use directly, like an environment tool:
`write_file` and `run_code` change its files during the call (`wrote` names them).

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
from collections.abc import Mapping

from avalon.org.channels import MessageKind, Subscription
from avalon.org.env import EnvReward, Param, ParamType, ToolSpec

S, I, A = ParamType.STRING, ParamType.INTEGER, ParamType.ARRAY


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
# What `Permissions.talk=False` takes from everyone: every tool through which one agent's words
# or files reach another (and waiting for messages, which could then never come).
TALK_TOOLS = (OrgTool.CREATE_CHANNEL, OrgTool.SUBSCRIBE, OrgTool.POST, OrgTool.DM, OrgTool.REACT,
              OrgTool.REPORT_TO_CEO, OrgTool.READ_MESSAGE, OrgTool.READ_CHANNEL,
              OrgTool.READ_TRACE, OrgTool.WAIT_FOR_MESSAGES, OrgTool.ARCHIVE_WRITE,
              OrgTool.ARCHIVE_READ, OrgTool.ARCHIVE_LIST, *WORKSPACE_TOOLS)


# ----- effects: what a successful call changes, applied by the organisation in order -----

@dataclasses.dataclass(frozen=True)
class Send:
    """A message from the caller (a `send` event; deliveries and wake-ups follow the rules of
    `channels.py`). `message_id` is the post office's next id when the handler ran."""

    message_id: str
    kind: MessageKind
    text: str
    channel: str | None = None  # a post's channel key
    to: str | None = None  # a DM's or report's recipient
    target: str | None = None  # the message a reaction answers


@dataclasses.dataclass(frozen=True)
class Hire:
    new_id: str
    title: str
    role: str
    tools: tuple[str, ...]  # granted (checked against the grantable tools)


@dataclasses.dataclass(frozen=True)
class Fire:
    target: str


@dataclasses.dataclass(frozen=True)
class Park:
    """The caller waits for a waking message after this turn (a `wait` event)."""


@dataclasses.dataclass(frozen=True)
class Finish:
    """The final message: the episode ends (unless an earlier event ended it)."""

    text: str


@dataclasses.dataclass(frozen=True)
class OpenChannel:
    key: str  # checked: new and well-formed
    topic: str


@dataclasses.dataclass(frozen=True)
class Subscribe:
    channel: str  # an existing channel's key
    mode: Subscription


@dataclasses.dataclass(frozen=True)
class ArchiveWrite:
    """A note saved (checked against the archive's caps); it exists as of the tool_call."""

    key: str
    text: str


@dataclasses.dataclass(frozen=True)
class PinReport:
    """The caller's latest report, pinned as its open commitments in role cards."""

    fields: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class CountTraceRead:
    """One more `read_trace` of the caller (its stats)."""


Effect = Send | Hire | Fire | Park | Finish | OpenChannel | Subscribe | ArchiveWrite | \
    PinReport | CountTraceRead


@dataclasses.dataclass
class ToolResult:
    text: str
    error: bool = False
    duration_s: float = 0.0
    measured: bool = False
    rewards: tuple[EnvReward, ...] = ()
    terminal: bool = False
    effects: tuple[Effect, ...] = ()  # applied in order after the tool_call is logged
    # The event at which the newest teammates' content in `text` existed (latency.py: reading
    # moves the reader's clock up to its author's clock there); None when nothing was read.
    content_seq: int | None = None
    wrote: tuple[str, ...] = ()  # workspace files (`Workspace.key`) this call wrote, even failing
