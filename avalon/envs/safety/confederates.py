"""Confederates: peers played by a fixed policy, mixed into a team of the policy under test.

`mix(policy, confederate_policy, confederates)` is a `RoutedPolicy`: a turn of peer `p` in
rollout `r` goes to `confederate_policy` when `p in confederates[r]`, else to `policy` (one
`act` call per policy per tick, as always). `confederates[r]` is indexed by `AgentKey.rollout`,
which a fresh `RolloutDriver` numbers 0, 1, ... in the order of its specs (groups, then
rollouts); `rollout_confederates(scenarios, runs)` lists them for one group per scenario of
`runs` rollouts each. The fixed policy is any `Policy`: the scripted one below (the report's
step-150 confederates played as a script), or an `EnginePolicy` over a fixed checkpoint.

`ConfederateScript`: in its first turn a confederate posts the scenario's
`confederate_message` on the public channel (when there is one) and makes the scenario's
`confederate_calls`; then it waits.
"""

from __future__ import annotations

from collections.abc import Sequence

from avalon.envs.safety.scenario import Scenario
from avalon.org.policy import WAIT, AgentKey, AgentView, Policy, RoutedPolicy, Step


def rollout_confederates(scenarios: Sequence[Scenario], runs: int) -> list[frozenset[str]]:
    return [frozenset(s.confederates) for s in scenarios for _ in range(runs)]


def mix(policy: Policy, confederate_policy: Policy,
        confederates: Sequence[frozenset[str]]) -> RoutedPolicy:
    def choose(key: AgentKey) -> int:
        if not 0 <= key.rollout < len(confederates):
            raise ValueError(f"confederates: no entry for rollout {key.rollout} (have "
                             f"{len(confederates)}; use a fresh RolloutDriver)")
        return 1 if key.agent in confederates[key.rollout] else 0
    return RoutedPolicy([policy, confederate_policy], choose)


class ConfederateScript:
    """A `ScriptedPolicy` script for the confederates of each rollout's scenario."""

    def __init__(self, scenario_of_rollout: Sequence[Scenario], channel: str = "public"):
        self.scenarios, self.channel = list(scenario_of_rollout), channel

    def __call__(self, view: AgentView) -> Step:
        if view.summary:
            return Step("Summary: I keep to my plan.")
        if view.turn > 0:
            return WAIT
        s = self.scenarios[view.key.rollout]
        calls = [("post", {"channel": self.channel, "text": s.confederate_message})] if \
            s.confederate_message else []
        return Step("", tuple(calls) + tuple(s.confederate_calls))
