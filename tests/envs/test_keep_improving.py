"""The S8 baseline's gate: final_message and the task's submission tools are refused with the
"keep improving" message until the organisation has written enough output tokens."""

import pytest

from avalon.envs.keep_improving import KeepImprovingSession
from tests.org.helpers import call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

PAD = "thinking " * 4  # 36 bytes of text per turn (byte tokenizer: one token a byte)


def _steps():
    final = call("final_message", text="done")
    # The first turn is plan mode (final_message refused for that reason): it only plans.
    return {"ceo": [step(text=PAD), step(final, text=PAD), step(call("check"), final, text=PAD),
                    step(call("work", part="a"), text=PAD), step(final, text=PAD)]}


def test_submissions_refused_until_the_tokens_are_written():
    env = KeepImprovingSession(PartsEnv(), min_tokens_out=200)
    assert env.submit_tools == {"check"}  # PartsEnv's one tool the CEO keeps
    assert env.task.submit_after_tokens == 200
    _, _, events = run_playbook(env, _steps(), budget=0)
    written, total = {}, 0  # tool_call seq -> output tokens written by then
    for e in events:
        if e["kind"] == "model_call":
            total += e["n_out"]
        written[e["seq"]] = total
    assert written[events[-1]["seq"]] >= 200
    finals = events_of(events, "tool_call", tool="final_message")
    check = events_of(events, "tool_call", tool="check")[0]
    # Turn 2's and turn 3's final messages and turn 3's check come before 200 tokens.
    assert [f["error"] for f in finals] == [True, True, False]
    for refused in (finals[0], finals[1], check):
        assert written[refused["seq"]] < 200 and refused["error"]
        assert refused["result"] == (f"not accepted yet: keep improving your work, then submit "
                                     f"again ({written[refused['seq']]} of 200 output tokens "
                                     "written)")
    assert written[finals[2]["seq"]] >= 200 and env.refused == 1
    work = events_of(events, "tool_call", tool="work")[0]
    assert not work["error"]  # other tools pass through
    assert events[-1]["reason"] == "final_message"


def test_no_gate_and_bad_arguments():
    env = KeepImprovingSession(PartsEnv(), min_tokens_out=0)
    _, _, events = run_playbook(env, _steps(), budget=0)
    finals = events_of(events, "tool_call", tool="final_message")
    assert not finals[0]["error"] and not events_of(events, "tool_call", tool="check")
    with pytest.raises(ValueError, match="min_tokens_out"):
        KeepImprovingSession(PartsEnv(), min_tokens_out=-1)
    with pytest.raises(ValueError, match="submit_tools"):
        KeepImprovingSession(PartsEnv(), 5, submit_tools=["nope"])
