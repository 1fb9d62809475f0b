"""The no-CEO mode: N peers with identical briefs on a public channel, no hiring."""

import pytest

from avalon.envs.base import Split, UnknownTaskError
from avalon.envs.safety import ScenarioEnv
from avalon.envs.safety.games import stag_hunt
from avalon.org import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.latency import replay
from avalon.org.peers import PeerTeam
from avalon.org.policy import Playbook, ScriptedPolicy
from tests.envs.safety.helpers import CHAT, ORG, do, events_of


def _run(steps, n=8, budget=0):
    env = ScenarioEnv(stag_hunt())
    session = env.session("stag_hunt-heldout-0", seed=0)
    driver = RolloutDriver(ScriptedPolicy(CHAT, Playbook(steps)), CHAT, ORG)
    return driver.run([GroupSpec(0, (RolloutSpec(session, budget, 0, peers=PeerTeam(n)),))])


def test_peers_start_together_with_the_same_card_and_tools():
    seen = {}

    def script(view):
        seen.setdefault(view.key.agent, view)
        return do(("wait_for_messages", {}))

    env = ScenarioEnv(stag_hunt())
    session = env.session("stag_hunt-heldout-0", seed=0)
    RolloutDriver(ScriptedPolicy(CHAT, script), CHAT, ORG).run(
        [GroupSpec(0, (RolloutSpec(session, 0, 0, peers=PeerTeam(8)),))])
    assert sorted(seen) == [f"p{i}" for i in range(1, 9)]
    tools = {v.tools for v in seen.values()}
    assert len(tools) == 1
    [tools] = tools
    assert {"hunt", "status", "post", "dm", "wait_for_messages"} <= set(tools)
    assert not {"hire", "fire", "create_channel", "final_message", "report_to_ceo",
                "write_file", "run_code"} & set(tools)
    for pid, v in seen.items():
        assert "Stag hunt" in v.system  # every peer reads the task
        assert "#public full" in v.system
        assert all(f"p{i} Member" in v.system for i in range(1, 9))  # the whole roster
        # Identical briefs: the cards differ only in the agent's own id and roster order.
        assert v.system.startswith(f"You are {pid}, Member.")
        assert v.turn == 0 and "Start." in v.obs


def test_a_post_reaches_every_peer_and_hiring_is_refused():
    steps = {"p1": [do(("post", {"channel": "public", "text": "stag please"}),
                       ("hire", {"title": "x", "role": "y", "tools": []}))]}
    result = _run(steps, n=4)
    events = result.logs[0][0].events
    [send] = events_of(events, "send", agent="p1")
    assert send["to"] == ["p2", "p3", "p4"] and send["channel"] == "#public"
    assert {e["agent"] for e in events_of(events, "deliver")} == {"p2", "p3", "p4"}
    [hire] = events_of(events, "tool_call", agent="p1", tool="hire")
    assert hire["error"] and "not one of your tools" in hire["result"]
    assert not events_of(events, "hire")
    assert not [e for e in events if e["kind"] == "model_call" and e["agent"] == "ceo"]
    # The same event log and latency as any rollout: the clock replays from the log.
    assert replay(events).task_latency_s == pytest.approx(
        max(result.groups[0].rollouts[0].metrics["latency_s"], 0.0))
    assert events[0]["kind"] == "start" and events[-1]["kind"] == "end"


def test_the_game_ends_on_the_environment_event():
    steps = {f"p{i}": [do(("hunt", {"choice": "stag"}))] for i in range(1, 9)}
    result = _run(steps)
    events = result.logs[0][0].events
    assert events[-1]["reason"] == "env_terminal"
    assert result.groups[0].rollouts[0].metrics["env/payoff/p1"] == 10.0


def test_no_ceo_mode_rejects_a_budget_and_bad_sizes():
    with pytest.raises(ValueError, match="budget must be 0"):
        _run({}, budget=2)
    with pytest.raises(ValueError, match="PeerTeam.n"):
        PeerTeam(0)
    with pytest.raises(ValueError, match="PeerTeam.channel"):
        PeerTeam(3, channel="Bad Name")


def test_scenarios_are_held_out_only():
    env = ScenarioEnv(stag_hunt())
    assert env.task_ids(Split.TRAIN) == ()
    assert env.task_ids(Split.HELDOUT) == ("stag_hunt-heldout-0",)
    with pytest.raises(UnknownTaskError, match="stag_hunt-train-0"):
        env.session("stag_hunt-train-0", seed=0)
    with pytest.raises(ValueError, match="clock_s"):
        env.session("stag_hunt-heldout-0", seed=0, clock_s=-1)
