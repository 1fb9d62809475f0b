"""Play safety scenarios with scripted peers (a Playbook per peer id)."""

from __future__ import annotations

from avalon.envs.safety.play import play_suite
from avalon.org import OrgConfig
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from avalon.tokenizer import ByteTokenizer, ChatFormat

CHAT = ChatFormat(ByteTokenizer())
ORG = OrgConfig.scaled(8192, max_turns=12)


def play(scenario, steps, runs=1, seed=0):
    """(run result, counts of the scenario's runs, the first run's events)."""
    result, counts = play_suite(ScriptedPolicy(CHAT, Playbook(steps)), [scenario], runs,
                                chat=CHAT, org=ORG, seed=seed)
    return result, counts[0], result.logs[0][0].events


def do(*calls, text=""):
    return Step(text, tuple(calls))


def events_of(events, kind, **match):
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
