"""Derived latency (SPEC §2) from hand-built event logs, each rule against a hand computation.

Token counts are chosen so every duration is a binary fraction: sums are exact.
"""

import json

from avalon.org.events import EventKind, EventLog, read_jsonl
from avalon.org.latency import ClockReplay, model_call_seconds, replay
from avalon.tools import latency as latency_cli

K = EventKind


def _log(*events):
    log = EventLog()
    for kind, agent, cause, fields in events:
        log.append(kind, agent, cause, **fields)
    return log


def test_rule1_model_call_counts_new_prompt_tokens_and_outputs():
    assert model_call_seconds(15000, 0) == 1.0 and model_call_seconds(0, 50) == 1.0
    log = _log((K.START, "ceo", None, {}),
               (K.MODEL_CALL, "ceo", 0, dict(n_in_new=7500, n_out=25)),   # 0.5 + 0.5
               (K.MODEL_CALL, "ceo", 1, dict(n_in_new=3750, n_out=100)))  # 0.25 + 2
    r = replay(log.events)
    assert r.clocks_s == {"ceo": 3.25}
    assert r.task_latency_s == 3.25


def test_rule2_tool_call_adds_its_duration():
    log = _log((K.START, "ceo", None, {}),
               (K.TOOL_CALL, "ceo", 0, dict(tool="work", duration_s=2.5)),
               (K.TOOL_CALL, "ceo", 1, dict(tool="work", duration_s=0.125)))
    assert replay(log.events).clocks_s == {"ceo": 2.625}


def test_rule3_waiting_is_free():
    log = _log((K.START, "ceo", None, {}),
               (K.MODEL_CALL, "ceo", 0, dict(n_in_new=0, n_out=50)),
               (K.WAIT, "ceo", 1, {}),
               (K.WAKE, "ceo", 2, dict(message_id="m9")),
               (K.MODEL_CALL, "ceo", 3, dict(n_in_new=0, n_out=25)))
    assert replay(log.events).clocks_s == {"ceo": 1.5}


def test_rule4_hire_starts_at_ceo_clock_and_delivery_moves_receiver_up():
    log = _log((K.START, "ceo", None, {}),
               (K.MODEL_CALL, "ceo", 0, dict(n_in_new=0, n_out=100)),          # ceo 2
               (K.HIRE, "ceo", 1, dict(new_agent="a1", title="x")),            # a1 starts at 2
               (K.HIRE, "ceo", 1, dict(new_agent="a2", title="y")),            # a2 starts at 2
               (K.MODEL_CALL, "a1", 2, dict(n_in_new=0, n_out=200)),           # a1 6
               (K.SEND, "a1", 4, dict(message_id="m1", to=["a2", "ceo"])),     # sent at 6
               (K.MODEL_CALL, "a2", 3, dict(n_in_new=0, n_out=400)),           # a2 10
               (K.DELIVER, "a2", 5, dict(message_id="m1")),                    # 6 < 10: stays
               (K.DELIVER, "ceo", 5, dict(message_id="m1")))                   # 2 -> 6
    r = replay(log.events)
    assert r.clocks_s == {"ceo": 6.0, "a1": 6.0, "a2": 10.0}
    clocks = ClockReplay()
    for e in log.events[:3]:
        clocks.apply(e)
    assert clocks.clock("a1") == 2.0  # right at the hire, before a1 did anything


def test_reading_moves_the_reader_up_to_the_content_and_the_path_follows():
    log = _log(
        (K.START, "ceo", None, {}),                                                # 0
        (K.MODEL_CALL, "ceo", 0, dict(n_in_new=0, n_out=50)),                      # 1 ceo 1
        (K.TOOL_CALL, "ceo", 1, dict(tool="hire", duration_s=0.0)),                # 2
        (K.HIRE, "ceo", 2, dict(new_agent="a1", title="t")),                       # 3 a1 1
        (K.MODEL_CALL, "a1", 3, dict(n_in_new=0, n_out=100)),                      # 4 a1 3
        (K.TOOL_CALL, "a1", 4, dict(tool="archive_write", duration_s=0.5)),        # 5 a1 3.5
        (K.MODEL_CALL, "ceo", 2, dict(n_in_new=0, n_out=25)),                      # 6 ceo 1.5
        # The note was written at a1's 3.5: the CEO cannot read it before.
        (K.TOOL_CALL, "ceo", 6, dict(tool="archive_read", duration_s=0.0,
                                     content_seq=5)),                              # 7 ceo 3.5
        (K.MODEL_CALL, "a1", 5, dict(n_in_new=0, n_out=50)),                       # 8 a1 4.5
        # Content older than the reader's clock moves nothing; the duration still counts.
        (K.TOOL_CALL, "a1", 8, dict(tool="read_trace", duration_s=0.25,
                                    content_seq=6)),                               # 9 a1 4.75
        (K.TOOL_CALL, "ceo", 6, dict(tool="read_file", duration_s=0.125,
                                     content_seq=8)),                              # 10 4.5+1/8
        (K.MODEL_CALL, "ceo", 10, dict(n_in_new=0, n_out=50)),                     # 11 ceo 5.625
    )
    clocks = ClockReplay()
    for e in log.events:
        clocks.apply(e)
    assert [clocks.clock_at(s) for s in (5, 6, 7, 9, 10)] == [3.5, 1.5, 3.5, 4.75, 4.625]
    r = clocks.report()
    assert r.clocks_s == {"ceo": 5.625, "a1": 4.75}
    # Back from the CEO's last call: event 10's read moved its clock, so the path crosses to
    # a1's model call 8 (the read at 7 is no longer on it) and a1's chain back to the hire.
    assert r.critical_path == [0, 1, 2, 3, 4, 5, 8, 10, 11]
    assert r.critical_time_s == {"ceo": 2.125, "a1": 3.5}
    assert sum(r.critical_time_s.values()) == r.task_latency_s == 5.625


def test_rule5_task_latency_is_largest_clock_and_critical_path():
    log = _log(
        (K.START, "ceo", None, {}),                                             # 0
        (K.MODEL_CALL, "ceo", 0, dict(n_in_new=15000, n_out=50)),               # 1 ceo 2
        (K.TOOL_CALL, "ceo", 1, dict(tool="hire", duration_s=0.0)),             # 2
        (K.HIRE, "ceo", 2, dict(new_agent="a1", title="t")),                    # 3 a1 2
        (K.TOOL_CALL, "ceo", 1, dict(tool="hire", duration_s=0.0)),             # 4
        (K.HIRE, "ceo", 4, dict(new_agent="a2", title="t")),                    # 5 a2 2
        (K.MODEL_CALL, "a1", 3, dict(n_in_new=7500, n_out=25)),                 # 6 a1 3
        (K.TOOL_CALL, "a1", 6, dict(tool="work", duration_s=4.0)),              # 7 a1 7
        (K.MODEL_CALL, "ceo", 5, dict(n_in_new=0, n_out=50)),                   # 8 ceo 3
        (K.TOOL_CALL, "ceo", 8, dict(tool="post", duration_s=0.0)),             # 9
        (K.SEND, "ceo", 9, dict(message_id="m1", to=["a1", "a2"])),             # 10 at 3
        (K.TOOL_CALL, "ceo", 8, dict(tool="wait_for_messages", duration_s=0.0)),  # 11
        (K.WAIT, "ceo", 11, {}),                                                # 12
        (K.MODEL_CALL, "a2", 5, dict(n_in_new=7500, n_out=0)),                  # 13 a2 2.5
        (K.DELIVER, "a1", 10, dict(message_id="m1")),                           # 14 a1 stays 7
        (K.DELIVER, "a2", 10, dict(message_id="m1")),                           # 15 a2 -> 3
        (K.TOOL_CALL, "a1", 14, dict(tool="report_to_ceo", duration_s=0.0)),    # 16
        (K.SEND, "a1", 16, dict(message_id="m2", to=["ceo"])),                  # 17 at 7
        (K.WAKE, "ceo", 17, dict(message_id="m2")),                             # 18
        (K.DELIVER, "ceo", 17, dict(message_id="m2")),                          # 19 ceo -> 7
        (K.MODEL_CALL, "a2", 15, dict(n_in_new=0, n_out=100)),                  # 20 a2 5
        (K.MODEL_CALL, "ceo", 19, dict(n_in_new=3750, n_out=25)),               # 21 ceo 7.75
        (K.END, "ceo", 21, dict(reason="final_message")),                       # 22
    )
    r = replay(log.events)
    assert r.clocks_s == {"ceo": 7.75, "a1": 7.0, "a2": 5.0}
    assert r.task_latency_s == 7.75
    # Walk back from the CEO: its deliver of m2 moved its clock, so the path crosses to a1's
    # send; a1's deliver of m1 did not (3 < 7), so a1's own chain continues back to its hire.
    assert r.critical_path == [0, 1, 2, 3, 6, 7, 14, 16, 17, 19, 21, 22]
    on_path = (15000 + 50) + (7500 + 25) + (3750 + 25)
    total = on_path + 50 + 7500 + 100
    assert (r.critical_tokens, r.total_tokens) == (on_path, total)
    assert r.critical_token_share == on_path / total
    assert r.critical_time_s == {"ceo": 2.75, "a1": 5.0, "a2": 0.0}
    assert sum(r.critical_time_s.values()) == r.task_latency_s


def test_single_chain_share_is_one_and_cli(tmp_path, capsys):
    log = _log((K.START, "ceo", None, {}),
               (K.MODEL_CALL, "ceo", 0, dict(n_in_new=100, n_out=10)),
               (K.TOOL_CALL, "ceo", 1, dict(tool="work", duration_s=1.0)),
               (K.MODEL_CALL, "ceo", 2, dict(n_in_new=20, n_out=10)))
    path = tmp_path / "events.jsonl"
    log.write(path)
    assert read_jsonl(path) == list(log.events)
    latency_cli.main([str(path)])
    out = json.loads(capsys.readouterr().out)
    assert out["critical_token_share"] == 1.0
    assert out["clocks_s"] == {"ceo": model_call_seconds(120, 20) + 1.0}
    assert out["task_latency_s"] == out["clocks_s"]["ceo"]


def test_bad_logs_name_the_problem():
    import pytest

    with pytest.raises(ValueError, match="before its send"):
        replay([{"seq": 0, "agent": "a", "kind": "deliver", "cause": None, "message_id": "m1"}])
    start = {"seq": 0, "agent": "ceo", "kind": "start", "cause": None}
    for bad in (1, 7):  # itself, or a later event
        with pytest.raises(ValueError, match=f"content_seq {bad} is not an earlier event"):
            replay([start, {"seq": 1, "agent": "ceo", "kind": "tool_call", "cause": 0,
                            "duration_s": 0.0, "content_seq": bad}])
    with pytest.raises(ValueError, match="n_out"):
        replay([{"seq": 0, "agent": "a", "kind": "model_call", "cause": None, "n_in_new": 1}])
