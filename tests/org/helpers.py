"""Shared helpers for organisation tests: run one rollout with a scripted playbook."""

from __future__ import annotations

from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.policy import AgentView, Playbook, ScriptedPolicy, Step
from avalon.tokenizer import ByteTokenizer, ChatFormat

CHAT = ChatFormat(ByteTokenizer())


class Recorder:
    """Wraps a script and keeps every view it was shown: views[agent] = [view, ...]."""

    def __init__(self, script):
        self.script = script
        self.views: dict[str, list[AgentView]] = {}

    def __call__(self, view: AgentView) -> Step:
        self.views.setdefault(view.key.agent, []).append(view)
        return self.script(view)


def run_playbook(env, steps, *, budget=3, config=None, seed=0, summary_text="summary"):
    """Plays one rollout; returns (run result, recorder, organisation log events)."""
    rec = Recorder(Playbook(steps, summary_text=summary_text))
    cfg = config or OrgConfig.scaled(8192)
    driver = RolloutDriver(ScriptedPolicy(CHAT, rec), CHAT, cfg)
    result = driver.run([GroupSpec(0, (RolloutSpec(env, budget, seed),))])
    return result, rec, result.logs[0][0].events


def call(tool, /, **args) -> tuple[str, dict]:
    return tool, args


def step(*calls, text="") -> Step:
    return Step(text, tuple(calls))


def events_of(events, kind, **match):
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
