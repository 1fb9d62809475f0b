"""Tool handlers read the organisation and return effects; they change nothing themselves
(avalon/org/handlers.py). Every handler is called, with good and bad arguments, on an
organisation in mid-episode, and the state it could reach is compared before and after."""

import math

import pytest

from avalon.org import OrgConfig, PromptStyle
from avalon.org.errors import ToolError
from avalon.org.handlers import HANDLERS
from avalon.org.organisation import Organisation
from avalon.org.policy import Playbook, ScriptedPolicy
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
)
from avalon.org.workspace import Workspace
from tests.org.helpers import CHAT, call, step
from tests.org.toyenv import PartsEnv

CFG = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
STEPS = {
    "ceo": [step(call("create_channel", name="plan"),
                 call("hire", title="Engineer", role="build", tools=["work", "write_file"]),
                 call("archive_write", key="plan", text="the plan")),
            step(call("post", channel="plan", text="hello"), call("dm", to="a1", text="go"))],
    "a1": [step(call("write_file", path="out.txt", text="x"),
                call("report_to_ceo", status="started"))],
}


@pytest.fixture
def org(tmp_path):
    o = Organisation(PartsEnv(), rollout=0, budget=2, seed=0, config=CFG, chat=CHAT,
                     workspace=Workspace(tmp_path))
    policy = ScriptedPolicy(CHAT, Playbook(STEPS))
    while "a1" not in o.agents or o.agents["a1"].last_report is None:
        turns = o.begin_tick()
        o.apply(turns, policy.act(turns))
        o.end_tick()
    assert not o.done and o.workspace.exists("out.txt") and o.archive
    return o


def _state(o: Organisation) -> str:
    """Everything a handler could change but the workspace's files, as text."""
    post = o.post
    agents = [(a.id, a.state, a.stats, a.last_report, a.pending, a.waiting, a.plan_mode,
               a.work is None, len(a.context.trace), a.trace_marks) for a in o.agents.values()]
    return repr((post.channels, post.topics, post.subs, post.messages, post._inbox,
                 o.archive, o.archive_seq, o.file_seq, o.hires, o.tokens_out, o.log.jsonl(),
                 agents, o.end_reason, o.final_message, o.done, o.retired))


CALLS = [  # (caller, tool, args, the effect types of a good call, or an error's words)
    ("ceo", OrgTool.HIRE, {"title": "QA", "role": "review", "tools": ["work"]}, (Hire,)),
    ("ceo", OrgTool.HIRE, {"title": "QA", "role": "", "tools": ["check"]}, "cannot grant"),
    ("ceo", OrgTool.FIRE, {"agent": "a1"}, (Fire,)),
    ("ceo", OrgTool.FIRE, {"agent": "ceo"}, "cannot be fired"),
    ("ceo", OrgTool.CREATE_CHANNEL, {"name": "news", "topic": "t"}, (OpenChannel,)),
    ("ceo", OrgTool.CREATE_CHANNEL, {"name": "plan"}, "already exists"),
    ("a1", OrgTool.SUBSCRIBE, {"channel": "plan", "mode": "muted"}, (Subscribe,)),
    ("a1", OrgTool.SUBSCRIBE, {"channel": "plan", "mode": "loud"}, "mode must be"),
    ("a1", OrgTool.POST, {"channel": "plan", "text": "hi @ceo"}, (Send,)),
    ("a1", OrgTool.POST, {"channel": "nope", "text": "hi"}, "no channel"),
    ("ceo", OrgTool.DM, {"to": "a1", "text": "more"}, (Send,)),
    ("ceo", OrgTool.DM, {"to": "ceo", "text": "me"}, "that is you"),
    ("a1", OrgTool.REACT, {"message_id": "m1", "emoji": "ok"}, (Send,)),
    ("a1", OrgTool.REACT, {"message_id": "m99", "emoji": "ok"}, "no message"),
    ("a1", OrgTool.REPORT_TO_CEO, {"status": "done", "evidence": ["file:out.txt"]},
     (PinReport, Send)),
    ("a1", OrgTool.REPORT_TO_CEO, {"status": "done", "evidence": ["seq:0"]}, "not a successful"),
    ("a1", OrgTool.READ_MESSAGE, {"message_id": "m1"}, ()),
    ("a1", OrgTool.READ_CHANNEL, {"channel": "plan", "last": 5}, ()),
    ("a1", OrgTool.READ_CHANNEL, {"channel": "plan", "last": 500}, "last must be"),
    ("a1", OrgTool.ROSTER, {}, ()),
    ("a1", OrgTool.READ_TRACE, {"agent": "ceo"}, (CountTraceRead,)),
    ("a1", OrgTool.READ_TRACE, {"agent": "ceo", "start": 10 ** 7}, "start must be"),
    ("a1", OrgTool.WAIT_FOR_MESSAGES, {}, (Park,)),
    ("a1", OrgTool.ARCHIVE_WRITE, {"key": "notes", "text": "n"}, (ArchiveWrite,)),
    ("a1", OrgTool.ARCHIVE_WRITE, {"key": "bad key", "text": "n"}, "archive key"),
    ("a1", OrgTool.ARCHIVE_READ, {"key": "plan"}, ()),
    ("a1", OrgTool.ARCHIVE_LIST, {}, ()),
    ("a1", OrgTool.READ_FILE, {"path": "out.txt"}, ()),
    ("a1", OrgTool.LIST_FILES, {}, ()),
    ("ceo", OrgTool.FINAL_MESSAGE, {"text": "done"}, (Finish,)),
    ("ceo", OrgTool.FINAL_MESSAGE, {"text": "  "}, "must not be empty"),
]


def test_handlers_change_nothing_and_return_their_effects(org):
    before = _state(org)
    tested = set()
    for caller, tool, args, want in CALLS:
        tested.add(tool)
        if isinstance(want, str):
            with pytest.raises(ToolError, match=want):
                HANDLERS[tool](org, caller, args)
        else:
            result = HANDLERS[tool](org, caller, args)
            assert not result.error and tuple(map(type, result.effects)) == want, tool
        assert _state(org) == before, tool
    # Every handler but the two that write the workspace by design.
    assert tested == set(OrgTool) - {OrgTool.WRITE_FILE, OrgTool.RUN_CODE}
    assert set(HANDLERS) == set(OrgTool)


def test_a_sent_message_takes_the_id_its_result_named(org):
    result = HANDLERS[OrgTool.POST](org, "a1", {"channel": "plan", "text": "x"})
    [send] = result.effects
    assert result.text == f"sent {send.message_id}" and send.message_id == org.post.next_id()


def test_the_production_organisation_refuses_the_lock_step_horizon(tmp_path):
    import dataclasses
    cfg = dataclasses.replace(CFG, schedule_horizon_s=math.inf)
    with pytest.raises(ValueError, match="lockstep.py"):
        Organisation(PartsEnv(), rollout=0, budget=0, seed=0, config=cfg, chat=CHAT,
                     workspace=Workspace(tmp_path))
