"""Clock-ordered scheduling (avalon/org/schedule.py): effects commit in derived-clock order,
messages arrive at the receiver's first boundary at or after their send time, and the clocks
the scheduler used are the replay of the log."""

import dataclasses
import math

import pytest

from avalon.org import OrgConfig, PromptStyle, RolloutDriver
from avalon.org.latency import MIN_MODEL_CALL_S, ClockReplay, model_call_seconds
from avalon.org.policy import ScriptedPolicy
from avalon.org.schedule import pick_batch, verify_schedule
from tests.org.helpers import CHAT, call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

CLOCK = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
LOCK = dataclasses.replace(CLOCK, schedule_horizon_s=math.inf)
HIRE = call("hire", title="Solver", role="solve", tools=["work"])


def _clocks_before(events):
    """seq -> the event's agent's replayed clock right before it."""
    clocks, before = ClockReplay(), {}
    for e in events:
        before[e["seq"]] = clocks.clock(e["agent"])
        clocks.apply(e)
    return before, clocks


def _race(config):
    # Tick 2 holds the CEO's turn 1 and a1's turn 0, both `work a` (the first solver of a part
    # is paid). The CEO is listed first, but writes 300 tokens of text first (6 s of model time)
    # while a1 writes only its call: a1's call starts, and ends, earlier on the clock.
    steps = {"ceo": [step(HIRE), step(call("work", part="a"), text="x" * 300),
                     step(call("final_message", text="done"))],
             "a1": [step(call("work", part="a"))]}
    env = PartsEnv({"a": 5.0})
    result, _, events = run_playbook(env, steps, budget=1, config=config)
    paid = [e.agent for e in result.groups[0].rollouts[0].rewards if e.label == "part"]
    return env, paid, events


def test_race_for_one_resource_goes_to_the_first_on_the_clock():
    env, paid, events = _race(CLOCK)
    assert [who for who, tool, _ in env.calls] == ["a1", "ceo"]
    assert paid == ["a1"]
    before, clocks = _clocks_before(events)
    works = {e["agent"]: e for e in events_of(events, "tool_call", tool="work")}
    assert before[works["a1"]["seq"]] < before[works["ceo"]["seq"]]
    assert clocks.clock_at(works["a1"]["seq"]) < clocks.clock_at(works["ceo"]["seq"])
    # Lock-step: the old order, listing order within the tick, whatever the clock says.
    env, paid, events = _race(LOCK)
    assert [who for who, tool, _ in env.calls] == ["ceo", "a1"]
    assert paid == ["ceo"]
    before, _ = _clocks_before(events)
    works = {e["agent"]: e for e in events_of(events, "tool_call", tool="work")}
    assert before[works["a1"]["seq"]] < before[works["ceo"]["seq"]]  # a1 was first on the clock


def _late_message(config):
    # The CEO works 45 s, then messages a1; a1 meanwhile works parts of 10 s each.
    costs = {"big": 45.0, "b": 10.0, "c": 10.0, "d": 10.0, "e": 10.0, "f": 10.0}
    steps = {"ceo": [step(HIRE), step(call("work", part="big"), call("dm", to="a1", text="hi")),
                     step(call("wait_for_messages"))],
             "a1": [step(call("work", part=p)) for p in "bcdef"]
             + [step(call("final_message", text="x"))]}
    env = PartsEnv(costs)
    _, _, events = run_playbook(env, steps, budget=1, config=config)
    return events, env


def test_late_message_arrives_at_the_first_boundary_after_its_send():
    events, env = _late_message(CLOCK)
    # The environment is called in clock order (what environments may rely on).
    clocks_s = [c for _, _, c in env.calls]
    assert clocks_s == sorted(clocks_s) and len(clocks_s) == 6
    before, clocks = _clocks_before(events)
    send = events_of(events, "send", agent="ceo")[0]
    send_clock = clocks.clock_at(send["seq"])
    hire_clock = clocks.clock_at(events_of(events, "hire")[0]["seq"])
    assert send_clock > 45 and hire_clock < 2
    deliver = events_of(events, "deliver", message_id=send["message_id"])[0]
    # Delivered without moving a1's clock: a1 got there by its own work.
    assert before[deliver["seq"]] >= send_clock
    starts = [before[e["seq"]] for e in events_of(events, "model_call", agent="a1")]
    after = [s for s in starts if s >= before[deliver["seq"]]]
    between = [s for s in starts if s < before[deliver["seq"]]]
    assert after and after[0] == before[deliver["seq"]]  # the boundary it landed at
    assert between[-1] < send_clock  # ... is the first one at or after the send
    assert len(between) >= 4  # a1's turns in between happened
    # Lock-step: the message lands at a1's next tick boundary and drags its clock up to 45+ s.
    events, env = _late_message(LOCK)
    assert [c for _, _, c in env.calls] != sorted(c for _, _, c in env.calls)
    before, clocks = _clocks_before(events)
    send = events_of(events, "send", agent="ceo")[0]
    deliver = events_of(events, "deliver", message_id=send["message_id"])[0]
    assert before[deliver["seq"]] < 25 < clocks.clock_at(send["seq"]) == \
        clocks.clock_at(deliver["seq"])


def test_parked_receiver_wakes_at_the_send_time():
    steps = {"ceo": [step(HIRE), step(call("work", part="a"), call("dm", to="a1", text="go")),
                     step(call("wait_for_messages"))],
             "a1": [step(call("wait_for_messages")), step(call("final_message", text="x"))]}
    _, _, events = run_playbook(PartsEnv({"a": 30.0}), steps, budget=1, config=CLOCK)
    before, clocks = _clocks_before(events)
    send = events_of(events, "send", agent="ceo")[0]
    deliver = events_of(events, "deliver", agent="a1")[0]
    assert before[deliver["seq"]] < 2  # parked since its first turn
    assert clocks.clock_at(deliver["seq"]) == clocks.clock_at(send["seq"]) > 30


def test_reads_see_only_the_past_under_the_clock():
    # A reader that lags far behind the writer on the clock: in lock-step it reads the future
    # (and is dragged up to it); under the clock scheduler it reads what existed at its clock.
    steps = {"ceo": [step(call("create_channel", name="plan"),
                          call("subscribe", channel="plan", mode="muted"), HIRE),
                     step(call("read_channel", channel="plan"), call("archive_list"),
                          call("read_trace", agent="a1")),
                     step(call("read_channel", channel="plan"))],
             "a1": [step(call("work", part="a"), call("post", channel="plan", text="a done"),
                         call("archive_write", key="k", text="v"))]}
    for config, moved in ((CLOCK, False), (LOCK, True)):
        _, _, events = run_playbook(PartsEnv({"a": 60.0}), steps, budget=1, config=config)
        before, clocks = _clocks_before(events)
        reads = [e for e in events_of(events, "tool_call", agent="ceo")
                 if e.get("content_seq") is not None]
        jumped = [e for e in reads if clocks.clock_at(e["content_seq"]) > before[e["seq"]]]
        assert bool(jumped) is moved, config.schedule_horizon_s


def test_clock_log_is_in_commit_order_and_byte_identical():
    from tests.org.test_driver import Delegating, _groups
    runs = [RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CLOCK).run(_groups())
            for _ in range(2)]
    for logs_a, logs_b in zip(runs[0].logs, runs[1].logs):
        for a, b in zip(logs_a, logs_b):
            assert a.jsonl().encode() == b.jsonl().encode()
    for group, scheds in zip(runs[0].logs, runs[0].scheduled):
        for log, sched in zip(group, scheds):
            assert len(sched) == sum(e["kind"] in ("model_call", "tool_call")
                                     for e in log.events)
            verify_schedule(log.events, sched, clock_order=True)
            # The scheduler's record is not a copy of the replay: shifting one start fails.
            bad = [dataclasses.replace(sched[1], start_s=sched[1].start_s + 1e-9)]
            with pytest.raises(ValueError, match="the scheduler started it at"):
                verify_schedule(log.events, bad, clock_order=True)


def test_pick_batch_horizon_and_next_effect():
    ready = [(10.0, 2), (10.01, 0), (10.02, 3), (11.0, 1)]
    assert pick_batch(ready, math.inf, MIN_MODEL_CALL_S) == [0, 2]  # 10.02 is not < 10.02
    assert pick_batch(ready, 10.005, MIN_MODEL_CALL_S) == [2]  # an effect comes first
    assert pick_batch(ready, math.inf, math.inf) == [0, 1, 2, 3]
    assert pick_batch(ready, math.inf, 0.0) == [2]
    with pytest.raises(ValueError, match="not before the next effect"):
        pick_batch(ready, 10.0, MIN_MODEL_CALL_S)
    assert MIN_MODEL_CALL_S == model_call_seconds(0, 1) == 0.02
    with pytest.raises(ValueError, match=r"OrgConfig\.schedule_horizon_s=-1\.0: must be >= 0"):
        OrgConfig.scaled(4096, schedule_horizon_s=-1.0)


def test_horizon_batches_more_turns_per_policy_call():
    # Four rollouts, K=2: under the clock scheduler each policy call still holds the turns of
    # many rollouts; a wider horizon gives fewer, larger calls.
    from tests.org.test_driver import CountingPolicy, Delegating, _groups
    calls = {}
    for h in (MIN_MODEL_CALL_S, 5.0, math.inf):
        policy = CountingPolicy(ScriptedPolicy(CHAT, Delegating()))
        cfg = dataclasses.replace(CLOCK, schedule_horizon_s=h)
        result = RolloutDriver(policy, CHAT, cfg).run(_groups())
        assert [t.turns for t in result.ticks] == policy.calls
        calls[h] = policy.calls
    assert max(calls[MIN_MODEL_CALL_S]) >= 8  # one turn per rollout at least
    assert len(calls[math.inf]) <= len(calls[5.0]) <= len(calls[MIN_MODEL_CALL_S])
