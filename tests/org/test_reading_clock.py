"""Reading moves the reader's clock (latency.py): every read tool names, as `content_seq`, the
event at which the newest content it returned existed, and the reader's clock is replayed up to
that event's clock. The CEO mutes the channel, so no delivery moves its clock: only reading.

Content newer than its reader exists in lock-step ticks (`schedule_horizon_s=inf`, used here),
where the CEO reads what a1 did 100 s later on the clock; under the clock scheduler a reader
sees only what existed at its clock (tests/org/test_schedule.py checks that no read moves a
clock there, except a measured run_code's files)."""

import math
import re

import pytest

from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.events import dumps
from avalon.org.latency import ClockReplay, replay
from avalon.org.policy import AgentView, Playbook, ScriptedPolicy, Step
from tests.org.helpers import CHAT, call, events_of, step
from tests.org.toyenv import PartsEnv

COSTS = {"b": 50.0, "c": 100.0}  # seconds of work: far more than the CEO's model time

WAIT = call("wait_for_messages")
GEN = "open('gen.txt', 'w').write('generated')\n"


def _steps():
    return {
        "ceo": [
            step(call("create_channel", name="plan"),
                 call("subscribe", channel="plan", mode="muted"),
                 call("hire", title="Engineer", role="build",
                      tools=["work", "write_file", "run_code"])),
            step(call("roster")),  # same tick as a1's first turn (the CEO is applied first)
            step(call("read_channel", channel="plan"), call("archive_read", key="notes"),
                 call("read_file", path="out.txt"), call("read_trace", agent="a1")),
            None,  # the tail of a1's trace: its length comes from the read before
            step(call("read_file", path="gen.txt"), call("list_files"), call("archive_list")),
            step(call("final_message", text="done")),
        ],
        "a1": [
            step(call("work", part="c"), call("post", channel="plan", text="c is solved"),
                 call("archive_write", key="notes", text="c is done"),
                 call("write_file", path="out.txt", text="c"),
                 call("write_file", path="gen.py", text=GEN)),
            step(call("work", part="b"), call("run_code", path="gen.py")),
            step(WAIT),
        ],
    }


class Script(Playbook):
    """The playbook, except that the CEO's `None` step reads the last tokens of a1's trace."""

    def __call__(self, view: AgentView) -> Step:
        s = super().__call__(view)
        if s is None:
            length = int(re.findall(r"trace a1 tokens \d+-\d+ of (\d+)", view.obs)[-1])
            return step(call("read_trace", agent="a1", start=length - 10))
        return s


def play():
    cfg = OrgConfig.scaled(8192, trace_read_tokens=64, schedule_horizon_s=math.inf)
    driver = RolloutDriver(ScriptedPolicy(CHAT, Script(_steps())), CHAT, cfg)
    result = driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(COSTS), 1, 0),))])
    return result, result.logs[0][0].events


@pytest.fixture(scope="module")
def episode():
    return play()


def _tool(events, agent, tool, nth=0):
    return events_of(events, "tool_call", agent=agent, tool=tool)[nth]


def test_each_read_names_the_event_its_content_came_from(episode):
    _, events = episode
    assert [e["tool"] for e in events_of(events, "tool_call", agent="ceo")
            if "content_seq" in e] == ["read_channel", "archive_read", "read_file",
                                       "read_trace", "read_trace", "read_file", "list_files",
                                       "archive_list"]
    assert all("content_seq" not in e for e in events_of(events, "tool_call", tool="roster"))
    post = _tool(events, "a1", "post")
    send = events_of(events, "send", cause=post["seq"])[0]
    assert _tool(events, "ceo", "read_channel")["content_seq"] == send["seq"]
    assert _tool(events, "ceo", "archive_read")["content_seq"] == \
        _tool(events, "a1", "archive_write")["seq"]
    assert _tool(events, "ceo", "read_file")["content_seq"] == \
        _tool(events, "a1", "write_file")["seq"]
    # Tokens 0-64 of a1's trace are its role card, there since the hire; its last tokens are
    # the observation of the latest turn boundary, as of a1's latest event then.
    hire = events_of(events, "hire", new_agent="a1")[0]
    assert _tool(events, "ceo", "read_trace")["content_seq"] == hire["seq"]
    tail = _tool(events, "ceo", "read_trace", 1)
    a1_before = [e["seq"] for e in events if e["agent"] == "a1" and e["seq"] < tail["seq"]]
    assert tail["content_seq"] == max(a1_before) and "of " in tail["result"]
    # gen.txt was written by the program a1 ran: the run_code call is its writer, and the
    # newest of the listed files.
    run = _tool(events, "a1", "run_code")
    assert _tool(events, "ceo", "read_file", 1)["content_seq"] == run["seq"]
    assert _tool(events, "ceo", "list_files")["content_seq"] == run["seq"]
    assert _tool(events, "ceo", "archive_list")["content_seq"] == \
        _tool(events, "a1", "archive_write")["seq"]


def test_reading_moves_the_ceo_up_to_a1s_work(episode):
    result, events = episode
    clocks = ClockReplay()
    before = {}
    for e in events:
        before[e["seq"]] = clocks.clock(e["agent"])
        clocks.apply(e)
    read = _tool(events, "ceo", "read_channel")
    send_clock = clocks.clock_at(read["content_seq"])
    # a1 worked 100 s before posting; the CEO had only spent model time.
    assert before[read["seq"]] < 100.0 < send_clock
    assert clocks.clock_at(read["seq"]) == send_clock + read["duration_s"]
    second = _tool(events, "ceo", "read_file", 1)
    assert clocks.clock_at(second["seq"]) > clocks.clock_at(_tool(events, "a1", "work", 1)["seq"])
    # The critical path runs from the CEO's end back through a1's work (via the read).
    report = replay(events)
    assert _tool(events, "a1", "work", 1)["seq"] in report.critical_path
    assert report.task_latency_s == result.groups[0].rollouts[0].metrics["latency_s"]


def _declared(events):
    """The log as JSON lines, with run_code's measured wall time (never repeatable) blanked."""
    return [dumps({**e, "duration_s": None} if e.get("measured") else e) for e in events]


def test_logs_stay_byte_identical(episode):
    _, events = episode
    _, again = play()
    assert any("content_seq" in e for e in events) and _declared(again) == _declared(events)
