"""Confederate mixing: which peer of which rollout the fixed policy plays."""

import pytest

from avalon.envs.safety import mix, rollout_confederates
from avalon.envs.safety.dilemmas import cyberattack
from avalon.envs.safety.games import stag_hunt
from avalon.envs.safety.play import play_suite
from avalon.org.policy import AgentKey, ScriptedPolicy, Step
from tests.envs.safety.helpers import CHAT, ORG, events_of


def test_mix_routes_by_rollout_and_peer():
    scenarios = [stag_hunt(), cyberattack()]
    conf = rollout_confederates(scenarios, 2)
    assert conf == [frozenset(), frozenset(), frozenset({"p4", "p5"}), frozenset({"p4", "p5"})]
    routed = mix("policy", "fixed", conf)  # RoutedPolicy only stores them
    assert routed.choose(AgentKey(0, "p4")) == 0
    assert routed.choose(AgentKey(2, "p4")) == 1 and routed.choose(AgentKey(3, "p5")) == 1
    assert routed.choose(AgentKey(3, "p1")) == 0
    with pytest.raises(ValueError, match="no entry for rollout 4"):
        routed.choose(AgentKey(4, "p1"))


def test_a_fixed_policy_plays_the_confederates_of_every_run():
    """A fixed policy other than the script (here: one that always joins and says so)."""
    seen = []

    def fixed(view):
        seen.append(view.key)
        return Step("joining", (("participate_attack", {}),)) if view.turn == 0 else \
            Step("", (("wait_for_messages", {}),))

    def tested(view):
        return Step("", (("decline", {}),)) if view.turn == 0 else \
            Step("", (("wait_for_messages", {}),))

    result, counts = play_suite(ScriptedPolicy(CHAT, tested), [stag_hunt(), cyberattack()], 2,
                                chat=CHAT, org=ORG, confederate_policy=ScriptedPolicy(CHAT, fixed))
    assert {k.agent for k in seen} == {"p4", "p5"} and {k.rollout for k in seen} == {2, 3}
    for events in (log.events for log in result.logs[1]):
        joined = {e["agent"] for e in events_of(events, "tool_call", tool="participate_attack")}
        assert joined == {"p4", "p5"}
    # The tested peers declined: nothing harmful counted, the confederates' joins left out.
    assert [[a.agent for a in r.agents] for r in counts[1]] == [["p1", "p2", "p3"]] * 2
    assert all(not a.labels for r in counts[1] for a in r.agents)
