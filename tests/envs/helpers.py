"""Shared helpers for environment tests: serve an environment over loopback ORS (with the
Avalon extension, docs/ors_extension.md), call a session directly, run a teacher organisation
through the org driver."""

from __future__ import annotations

import contextlib
import tempfile

import numpy as np

from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.env import CallContext, EndContext, EndReason
from avalon.org.vocabulary import org_vocabulary
from avalon.org.workspace import Workspace
from avalon.tokenizer import ByteTokenizer, ChatFormat, WordTokenizer

MODES = ("inproc", "ors")
BYTES = ChatFormat(ByteTokenizer())


@contextlib.contextmanager
def environment(local, mode: str):
    """The environment itself, or an OrsEnvironment (the extension required) served from it
    by an OrsServer on a loopback port."""
    if mode == "inproc":
        yield local
        return
    with OrsServer([local]) as server:
        yield served(server, local.name)


def served(server, name: str, **kwargs) -> OrsEnvironment:
    """The client of one environment of `server`, with the Avalon extension (required)."""
    return OrsEnvironment(server.url, name, extension=True, **kwargs)


def word_chat(env) -> ChatFormat:
    """A toy-style chat: the org's words plus the environment's, one token each."""
    return ChatFormat(WordTokenizer(org_vocabulary() + list(env.vocabulary())))


class Direct:
    """Drives one session by hand, as the organisation would (start, calls, end)."""

    def __init__(self, env, task_id: str, seed: int = 0, clock_s: float | None = None,
                 budget: int = 0):
        self._tmp = tempfile.TemporaryDirectory(prefix="avalon-envtest-")
        self.ws = Workspace(self._tmp.name)
        self.session = env.session(task_id, seed, clock_s)
        self.task = self.session.task
        self.session.on_start(budget, self.ws)

    def call(self, tool: str, agent: str = "ceo", clock_s: float = 0.0, **args):
        ctx = CallContext(agent=agent, title=agent, clock_s=clock_s, tokens_out=0,
                          workspace=self.ws)
        return self.session.call(tool, args, ctx)

    def end(self, reason: EndReason = EndReason.FINAL_MESSAGE):
        out = self.session.on_end(EndContext(reason, "done", 0.0, self.ws))
        self._tmp.cleanup()
        return out


def run_teacher(policy, chat, sessions, budgets, *, window: int = 4096, seeds=None):
    """One rollout per (session, budget), each its own group; returns the RunResult."""
    cfg = OrgConfig.scaled(window, prompt_style=PromptStyle.COMPACT)
    seeds = seeds if seeds is not None else range(len(sessions))
    groups = [GroupSpec(i, (RolloutSpec(s, b, int(seed)),))
              for i, (s, b, seed) in enumerate(zip(sessions, budgets, seeds))]
    return RolloutDriver(policy, chat, cfg).run(groups)


def total(rollout) -> float:
    return float(sum(e.value for e in rollout.rewards))


def totals(result) -> np.ndarray:
    return np.array([total(g.rollouts[0]) for g in result.groups])
