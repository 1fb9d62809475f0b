"""Every bad call a model can make yields its error message and its shaping flag, and the
rollout still finishes."""

import math

import numpy as np
import pytest

from avalon.inference.api import StopReason
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, TurnOutput
from avalon.org.toolcall import format_call
from avalon.rl.types import TokenFlag
from avalon.tokenizer import Special
from tests.org.helpers import CHAT, call, events_of, step
from tests.org.toyenv import PartsEnv

STRAY = "stray"  # a raw output holding a stray special token


class RawPolicy:
    """Scripted, but a step may also be raw token ids (what a model could sample)."""

    def __init__(self, steps):
        self.playbook = Playbook(steps)

    def act(self, turns):
        out = []
        for t in turns:
            s = self.playbook(t.view)
            if s.text == STRAY:
                ids = CHAT.tok.encode("x") + [CHAT.id(Special.SYSTEM)] + [CHAT.end_id]
            elif s.text.startswith("raw:"):
                ids = CHAT.output("", [s.text[4:]])
            else:
                ids = CHAT.output(s.text, [format_call(n, a) for n, a in s.calls])
            out.append(TurnOutput(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32),
                                  None, StopReason.STOP))
        return out

    def release(self, key):
        pass

    def prefill_shared(self, keys, prefix):
        pass


CEO_STEPS = [
    (step(call("work", part="a"), call("hire", title="Dev", role="r", tools=["write_file"])),
     "tool", "plan mode: work is refused in your first turn"),
    (step(text='raw:post {"channel": "plan", "text": }'), "malformed", "not valid JSON"),
    (step(call("teleport", to="moon")), "tool", "unknown tool 'teleport'"),
    (step(call("hire", title="Dev2", role="r", tools=[])), "tool", "budget 1: no hires left"),
    (step(call("fire", agent="ceo")), "tool", "the CEO cannot be fired"),
    (step(call("fire", agent="a7")), "tool", "no active agent 'a7'"),
    (step(call("read_file", path="../secret")), "tool", "contains '..'"),
    (step(call("read_file", path="/etc/passwd")), "tool", "is absolute"),
    (step(call("write_file", path="a/../../x", text="x")), "tool", "contains '..'"),
    (step(call("post", channel="nowhere", text="x")), "tool", "no channel #nowhere"),
    (step(call("create_channel", name="plan")), None, None),
    (step(call("post", channel="plan")), "tool", "missing argument 'text'"),
    (step(call("dm", to=3, text="x")), "tool", "argument 'to' must be string"),
    (step(call("roster", verbose=True)), "tool", "unknown argument 'verbose'"),
    (step(call("hire", title="X", role="r", tools=["final_message"])), "tool",
     "budget 1: no hires left"),
    (step(call("read_trace", agent="nobody")), "tool", "no agent 'nobody'"),
    (step(call("react", message_id="m99", emoji="+1")), "tool", "no message 'm99'"),
    (step(call("subscribe", channel="plan", mode="loud")), "tool",
     "mode must be full, light or muted, got 'loud'"),
    (step(call("create_channel", name="plan")), "tool", "channel #plan already exists"),
    (step(call("create_channel", name="Bad Name!")), "tool", "channel name 'Bad Name!'"),
    (step(text=STRAY), "malformed", "stray <|system|>"),
    (step(*[call("roster")] * 9), "malformed", "9 calls in one turn; the limit is 8"),
    (step(call("work", part="z")), "tool", "no part 'z'"),
    (step(text='raw:post {"channel":"plan","text":"lone \\ud800 surrogate"}'), None, None),
    (step(call("final_message", text="done")), None, None),
]
A1_STEPS = [
    (step(call("run_code", path="x.py")), "tool", "run_code is not one of your tools"),
    (step(call("final_message", text="x")), "tool", "final_message is not one of your tools"),
    (step(call("report_to_ceo", status="ok", evidence=["file:nope.txt"])), "tool",
     "no such workspace file"),
    (step(call("write_file", path="big.txt", text="x" * 5000)), "tool", "per-file limit"),
    (step(call("report_to_ceo", status="ok", evidence=["seq:3", "archive:none"])), "tool",
     "not a successful tool call of yours"),
]


@pytest.fixture(scope="module")
def episode():
    from avalon.org.workspace import WorkspaceLimits
    # Lock-step ticks: each CEO step meets one a1 step. On the derived clock a1's 5,000-token
    # write outlasts the CEO's whole script (the subject here is errors, not scheduling).
    cfg = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT,
                           workspace=WorkspaceLimits(max_file_bytes=4096),
                           schedule_horizon_s=math.inf)
    steps = {"ceo": [s for s, _, _ in CEO_STEPS], "a1": [s for s, _, _ in A1_STEPS]}
    driver = RolloutDriver(RawPolicy(steps), CHAT, cfg)
    result = driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(), 1, 0),))])
    return result, result.logs[0][0].events


def _sampled_flags(rows, events, agent):
    """The flags of each model call's sampled tokens, from the row layout (prompt, output)."""
    out = []
    calls = events_of(events, "model_call", agent=agent)
    for row in (r for r in rows if r.agent == agent):
        pos = 0
        for c in (c for c in calls if c["segment"] == row.segment):
            pos += c["n_in_new"]
            flags = set(row.flags[pos:pos + c["n_out"]].tolist())
            assert row.loss_mask[pos:pos + c["n_out"]].all()
            out.append(flags)
            pos += c["n_out"]
        assert pos == len(row.tokens)
    return out


@pytest.mark.parametrize("agent,steps", [("ceo", CEO_STEPS), ("a1", A1_STEPS)])
def test_each_bad_call_has_its_error_and_flag(episode, agent, steps):
    result, events = episode
    rows = result.groups[0].rollouts[0].rows
    flags = _sampled_flags(rows, events, agent)
    calls = events_of(events, "model_call", agent=agent)
    for i, (_, kind, message) in enumerate(steps):
        mc = calls[i]
        tool_calls = [e for e in events if e["kind"] == "tool_call" and e["cause"] == mc["seq"]]
        if kind == "malformed":
            assert message in mc["malformed"] and not tool_calls
            assert flags[i] == {int(TokenFlag.MALFORMED)}
        elif kind == "tool":
            errors = [e for e in tool_calls if e["error"]]
            assert errors and message in errors[0]["result"], (i, tool_calls)
            assert flags[i] == {int(TokenFlag.TOOL_ERROR)}
        else:
            assert not [e for e in tool_calls if e["error"]]
            assert flags[i] == {int(TokenFlag.NORMAL)}


def test_rollout_finishes_and_counts(episode):
    result, events = episode
    rollout = result.groups[0].rollouts[0]
    assert result.reports[0][0].end_reason == "final_message"
    assert events[-1]["kind"] == "end"
    result.logs[0][0].jsonl().encode("ascii")  # a lone surrogate in a message is escaped
    malformed = sum(k == "malformed" for _, k, _ in CEO_STEPS + A1_STEPS)
    tool = sum(k == "tool" for _, k, _ in CEO_STEPS + A1_STEPS)
    assert rollout.metrics["malformed_turns"] == malformed
    assert rollout.metrics["tool_error_turns"] == tool
    # The agent is told: an error line in its next observation.
    # (The first CEO error follows it into turn 1's observation.)
    assert rollout.hires == 1


def test_error_text_reaches_the_agent(episode):
    result, events = episode
    row = next(r for r in result.groups[0].rollouts[0].rows if r.agent == "ceo")
    text = CHAT.tok.decode(row.tokens)
    assert "work error] plan mode: work is refused in your first turn" in text
    assert "[error] malformed turn: call 1: post: arguments are not valid JSON" in text


def test_permissions_switch_tools():
    from avalon.org import Permissions
    from tests.org.helpers import run_playbook
    steps = {"ceo": [step(call("hire", title="Lead", role="r", tools=[])),
                     step(call("read_trace", agent="a1")), step(call("wait_for_messages"))],
             "a1": [step(call("hire", title="Sub", role="r", tools=[]),
                         call("create_channel", name="team"))]}
    base = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
    _, _, events = run_playbook(PartsEnv(), steps, budget=2, config=base)
    by_tool = {e["tool"]: e for e in events if e["kind"] == "tool_call" and e["agent"] != "ceo"}
    assert by_tool["hire"]["error"] and by_tool["create_channel"]["error"]
    assert not [e for e in events if e["kind"] == "tool_call" and e["tool"] == "read_trace"
                and e["error"]]
    import dataclasses
    open_org = dataclasses.replace(base, permissions=Permissions(
        specialists_hire=True, specialists_create_channels=True, read_traces=False))
    result, _, events = run_playbook(PartsEnv(), steps, budget=2, config=open_org)
    by_tool = {e["tool"]: e for e in events if e["kind"] == "tool_call"}
    assert not by_tool["create_channel"]["error"]
    hires = [e for e in events if e["kind"] == "hire"]
    assert [(h["agent"], h["new_agent"]) for h in hires] == [("ceo", "a1"), ("a1", "a2")]
    assert "unknown tool 'read_trace'" not in by_tool["read_trace"]["result"]
    assert by_tool["read_trace"]["result"] == "read_trace is not one of your tools"
    assert result.groups[0].rollouts[0].hires == 2
