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


def test_waiting_before_the_tokens_are_written_wakes_the_agent_with_the_refusal():
    """A single agent that waits with nothing in flight would end the episode (deadlock)
    before S8 matched the organisation's tokens: under the gate it is woken with the refusal
    instead, until the tokens are written; then waiting ends the episode as before."""
    wait = call("wait_for_messages")
    steps = {"ceo": [step(text=PAD)] + [step(wait, text=PAD)] * 8}
    env = KeepImprovingSession(PartsEnv(), min_tokens_out=150)
    _, _, events = run_playbook(env, steps, budget=0)
    outs = [e["n_out"] for e in events if e["kind"] == "model_call"]
    wakes = events_of(events, "wake")
    assert all(w["reason"] == "keep_improving" for w in wakes)
    # Woken after every wait until the written tokens reach 150; the wait after that ends it.
    written = [sum(outs[:i + 1]) for i in range(len(outs))]
    assert len(wakes) == sum(1 for w in written[1:-1] if w < 150) and written[-2] < 150
    assert written[-1] >= 150 and events[-1]["reason"] == "deadlock"
    obs = [e for e in events if e["kind"] == "model_call"]
    assert len(obs) == len(wakes) + 2  # the plan, then one turn per wake, then the last wait
    ungated = run_playbook(KeepImprovingSession(PartsEnv(), min_tokens_out=0), steps,
                           budget=0)[2]
    assert not events_of(ungated, "wake") and ungated[-1]["reason"] == "deadlock"
    assert sum(e["kind"] == "model_call" for e in ungated) == 2


def test_no_gate_and_bad_arguments():
    env = KeepImprovingSession(PartsEnv(), min_tokens_out=0)
    _, _, events = run_playbook(env, _steps(), budget=0)
    finals = events_of(events, "tool_call", tool="final_message")
    assert not finals[0]["error"] and not events_of(events, "tool_call", tool="check")
    with pytest.raises(ValueError, match="min_tokens_out"):
        KeepImprovingSession(PartsEnv(), min_tokens_out=-1)
    with pytest.raises(ValueError, match="submit_tools"):
        KeepImprovingSession(PartsEnv(), 5, submit_tools=["nope"])
