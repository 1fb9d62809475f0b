"""A scripted CEO hires three specialists, opens channels, sets subscriptions; every delivery
rule is checked against the event log and what each agent was shown."""

import pytest

from avalon.org.agents import AgentState
from avalon.org.channels import Subscription
from tests.org.helpers import call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

LONG = "Design notes: " + "the parser splits tokens at call markers and checks JSON. " * 3
WAIT = call("wait_for_messages")


@pytest.fixture(scope="module")
def episode():
    steps = {
        "ceo": [
            step(call("create_channel", name="plan"), call("create_channel", name="dev"),
                 call("hire", title="Lead Engineer", role="build", tools=["write_file"]),
                 call("hire", title="QA", role="test", tools=[]),
                 call("hire", title="Analyst", role="analyse", tools=["work"])),
            step(call("post", channel="plan", text="kickoff")),
            step(call("post", channel="dev", text=LONG), call("post", channel="dev",
                                                              text="@a3 ping"), WAIT),
            step(call("final_message", text="done")),
        ],
        "a1": [step(call("subscribe", channel="dev", mode="full"), WAIT), step(WAIT),
               step(call("dm", to="a2", text="hello"), WAIT)],
        "a2": [step(call("subscribe", channel="dev", mode="light"), WAIT), step(WAIT),
               step(call("report_to_ceo", status="tested", evidence=["seq:0"]),
                    call("report_to_ceo", status="tested"), WAIT)],
        "a3": [step(call("subscribe", channel="#dev", mode="muted"), WAIT), step(WAIT),
               step(call("react", message_id="m3", emoji="+1"), WAIT)],
    }
    env = PartsEnv()
    result, rec, events = run_playbook(env, steps, budget=3)
    return result, rec, events, env


def _obs(rec, agent):
    return [v.obs for v in rec.views[agent]]


def test_hires_channels_subscriptions(episode):
    result, rec, events, _ = episode
    hires = events_of(events, "hire")
    assert [(h["new_agent"], h["title"]) for h in hires] == [
        ("a1", "Lead Engineer"), ("a2", "QA"), ("a3", "Analyst")]
    assert result.reports[0][0].titles == {"ceo": "CEO", "a1": "Lead Engineer", "a2": "QA",
                                           "a3": "Analyst"}
    assert result.reports[0][0].end_reason == "final_message"
    rollout = result.groups[0].rollouts[0]
    assert rollout.hires == 3 and rollout.budget == 3
    # The rollout's info carries the same facts for the training driver, with sampled tokens
    # per title from the log's model calls.
    titles = {"ceo": "CEO", **{h["new_agent"]: h["title"] for h in hires}}
    by_title = {t: sum(e["n_out"] for e in events_of(events, "model_call", agent=a))
                for a, t in titles.items()}
    assert rollout.info == {"titles": ["Lead Engineer", "QA", "Analyst"],
                            "end_reason": "final_message", "tokens_out_by_title": by_title}
    assert rec.views["a1"][0].tools[-1] == "write_file" and "work" in rec.views["a3"][0].tools
    assert "work" not in rec.views["a2"][0].tools and "run_code" not in rec.views["a1"][0].tools
    # Each specialist's role card names its brief from the environment.
    assert {r.agent for r in rollout.rows} == {"ceo", "a1", "a2", "a3"}
    tok_text = {r.agent: r for r in rollout.rows}
    from tests.org.helpers import CHAT
    assert "Brief: fact2" in CHAT.tok.decode(tok_text["a2"].tokens)
    assert all(not e["error"] for e in events_of(events, "tool_call")
               if e["tool"] in ("subscribe", "create_channel", "hire"))


def test_full_light_muted_and_mention(episode):
    _, rec, events, _ = episode
    long_line = f"#dev ceo m2: {LONG}"
    snippet = f"#dev ceo m2: {LONG[:80]}... (read_message m2)"
    a1, a2, a3 = (_obs(rec, a) for a in ("a1", "a2", "a3"))
    assert long_line in a1[2]  # full: verbatim
    assert snippet in a2[2] and LONG not in a2[2]  # light: snippet + pointer
    assert "m2" not in "".join(a3)  # muted: nothing
    assert not events_of(events, "deliver", agent="a3", message_id="m2")
    assert "#dev ceo m3: @a3 ping" in a3[2]  # an @-mention goes through the mute, in full
    assert "#dev ceo m3: @a3 ping" in a1[2] and "#dev ceo m3: @a3 ping" in a2[2]
    assert events_of(events, "deliver", agent="a2", message_id="m3")[0]["mode"] == "light"
    send = events_of(events, "send", message_id="m2")[0]
    assert send["to"] == ["a1", "a2"]  # the muted a3 is not a recipient


def test_delivery_only_at_turn_boundaries(episode):
    _, rec, events, _ = episode
    # m1 ("kickoff") was posted in the tick where the specialists took their first turn: it
    # is not in that turn's observation but in the next one.
    for a in ("a1", "a2", "a3"):
        obs = _obs(rec, a)
        assert "kickoff" not in obs[0] and "#plan ceo m1: kickoff" in obs[1]
        first_call = events_of(events, "model_call", agent=a)[0]
        deliver = events_of(events, "deliver", agent=a, message_id="m1")[0]
        assert deliver["seq"] > first_call["seq"]
    by_seq = {e["seq"]: e for e in events}
    for d in events_of(events, "deliver"):
        assert by_seq[d["cause"]]["kind"] == "send" and d["cause"] < d["seq"]
        # A delivery is part of a turn boundary: the agent's next event is another delivery,
        # a compaction or the model call of its turn.
        after = [e for e in events if e["seq"] > d["seq"] and e["agent"] == d["agent"]]
        assert after and after[0]["kind"] in ("deliver", "model_call", "compaction")


def test_wait_and_wake(episode):
    _, rec, events, _ = episode
    dm_send = events_of(events, "send", message_kind="dm")[0]
    # a2 parked at the end of its second turn; light posts do not wake it, a1's DM does.
    a2_waits = events_of(events, "wait", agent="a2")
    wake = events_of(events, "wake", agent="a2", message_id=dm_send["message_id"])
    assert len(wake) == 1 and wake[0]["cause"] == dm_send["seq"]
    assert a2_waits[1]["seq"] < dm_send["seq"] < wake[0]["seq"]
    assert not [w for w in events_of(events, "wake", agent="a2") if w["message_id"] in
                ("m2", "m3")]
    # The DM is delivered after the light posts: (send time, seq) order.
    lines = _obs(rec, "a2")[2].splitlines()
    assert [ln.split(":")[0] for ln in lines if not ln.startswith("[")] == [
        "#dev ceo m2", "#dev ceo m3", "dm a1 m4"]
    # The reaction reaches the CEO without waking it; the report wakes it.
    react = events_of(events, "send", message_kind="reaction")[0]
    assert react["to"] == ["ceo"]
    assert not events_of(events, "wake", agent="ceo", message_id=react["message_id"])
    report = events_of(events, "send", message_kind="report")[0]
    assert events_of(events, "wake", agent="ceo", message_id=report["message_id"])
    ceo_last = _obs(rec, "ceo")[-1]
    assert "a3 reacted +1 to m3" in ceo_last and "report a2 m6: status: tested" in ceo_last


def test_wake_at_park_when_mail_is_waiting(episode):
    _, _, events, _ = episode
    # a1's first wait came with m1 already queued: it parks and wakes at once.
    a1 = [e for e in events if e["agent"] == "a1"]
    kinds = [e["kind"] for e in a1]
    i = kinds.index("wait")
    assert kinds[i + 1] == "wake" and a1[i + 1]["message_id"] == "m1"


def test_report_evidence_is_checked(episode):
    _, rec, events, _ = episode
    reports = events_of(events, "tool_call", agent="a2", tool="report_to_ceo")
    assert reports[0]["error"] and "not a successful tool call of yours" in reports[0]["result"]
    assert not reports[1]["error"]


def test_subscriptions_state(episode):
    result, _, _, _ = episode
    assert result.groups[0].rollouts[0].metrics["messages"] == 6
    assert AgentState.READY.value == "ready" and Subscription.LIGHT.value == "light"
