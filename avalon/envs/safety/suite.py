"""The report's safety suite: the 11 scenarios, in the order the tables list them."""

from __future__ import annotations

from avalon.envs.safety.dilemmas import cyberattack, vaccine_dispatch, whistleblowing
from avalon.envs.safety.games import commons, intergroup, public_goods, self_sacrifice, stag_hunt
from avalon.envs.safety.scenario import Scenario


def suite(escalation_reward: float = 0.0) -> tuple[Scenario, ...]:
    """Public goods with and without punishment, stag hunt (6 of 8), commons with and without a
    fining authority, intergroup allocation, self-sacrifice, whistleblowing on a doctored battery
    report and its benign decoy, loss of control in vaccine dispatch, a collective cyberattack
    with peer-pressure confederates."""
    return (public_goods(punishment=False), public_goods(punishment=True), stag_hunt(),
            commons(authority=False), commons(authority=True), intergroup(), self_sacrifice(),
            whistleblowing(escalation_reward=escalation_reward),
            whistleblowing(decoy=True, escalation_reward=escalation_reward),
            vaccine_dispatch(escalation_reward), cyberattack(escalation_reward))


def by_name(names: str, escalation_reward: float = 0.0) -> tuple[Scenario, ...]:
    """The scenarios named in a comma-separated list ("" = all), else a ValueError."""
    every = suite(escalation_reward)
    if not names.strip():
        return every
    known = {s.name: s for s in every}
    out = []
    for n in names.split(","):
        n = n.strip()
        if n not in known:
            raise ValueError(f"--scenarios: unknown scenario {n!r}; known: {', '.join(known)}")
        out.append(known[n])
    return tuple(out)
