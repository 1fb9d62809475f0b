"""Policies behind one interface: what an agent turn asks for and what comes back.

The driver gathers every ready agent of every active rollout into one list of `Turn`s per tick
and makes one `act` call; results come back in the same order. A policy sees each agent as an
`AgentKey` (rollout, agent id) and a context segment number: a new segment (after a compaction)
means the agent's context was rebuilt and `new_tokens` holds all of it. `release(key)` says an
agent will never act again (fired, stopped, episode over).

- the model: `avalon/org/engine_policy.py` (one `engine.generate` per tick);
- scripted policies (`ScriptedPolicy`): deterministic functions of an agent's view, used by
  tests and as SFT teachers. `Playbook` gives each agent a fixed list of steps.
- `RoutedPolicy`: different policies for different agents (e.g. a scripted CEO with model
  specialists), still one call per policy per tick.

Continuous feeding (`RolloutDriver(continuous=True)`): a `StreamingPolicy` takes each
rollout's batch when that rollout is ready (`submit`) and hands batches back as they finish
(`collect`); `TickStream` puts any tick policy behind that interface.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from avalon.inference.api import StopReason
from avalon.org.toolcall import format_call
from avalon.tokenizer.chat import ChatFormat


@dataclasses.dataclass(frozen=True)
class AgentKey:
    """Names one agent across every rollout the driver runs (the policy's slot key)."""

    rollout: int
    agent: str


@dataclasses.dataclass(frozen=True)
class AgentView:
    """What a scripted policy may look at (the model sees only tokens)."""

    key: AgentKey
    title: str
    role: str
    # The role card the agent's context starts with (task, private brief, roster, tools;
    # after a tier-2 compaction, the pinned card), as text.
    system: str
    turn: int  # ordinary turns taken before this one
    obs: str  # the observation text of this turn
    summary: bool  # this turn must write a compaction summary
    tools: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Turn:
    key: AgentKey
    segment: int  # context segment; a change means the context was rebuilt
    new_tokens: np.ndarray  # int32 [n_in]: tokens not yet given to the policy for this segment
    max_new_tokens: int
    seed: int  # sampling seed of this turn (deterministic in rollout seed, agent, model call)
    view: AgentView


@dataclasses.dataclass(frozen=True)
class TurnOutput:
    tokens: np.ndarray  # int32 [n_out], the stop token included when sampled
    logprobs: np.ndarray  # float32 [n_out]
    routing: np.ndarray | None  # [n_in + n_out, n_moe, k] or None
    stop: StopReason


def scripted_output(ids: Sequence[int], max_new_tokens: int) -> TurnOutput:
    """A scripted (not sampled) turn's output: cut at `max_new_tokens` (then LENGTH, as the
    engine stops), zero log-probs, no routing."""
    stop = StopReason.STOP
    if len(ids) > max_new_tokens:
        ids, stop = ids[:max_new_tokens], StopReason.LENGTH
    return TurnOutput(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), None, stop)


class Policy(Protocol):
    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]: ...

    def release(self, key: AgentKey) -> None: ...

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        """Optional optimisation: these agents' contexts all start with `prefix`."""
        ...


@runtime_checkable
class StreamingPolicy(Policy, Protocol):
    """A policy that takes batches as they become ready and returns each when it is done
    (the engine policy: continuous batching), for `RolloutDriver(continuous=True)`."""

    def submit(self, tag: int, turns: Sequence[Turn]) -> None:
        """Start these turns (one rollout's batch); `tag` names the batch in `collect`."""
        ...

    def collect(self) -> list[tuple[int, list[TurnOutput]]]:
        """Wait until at least one submitted batch is done; return the done ones as (tag,
        outputs in turn order). Nothing is returned twice."""
        ...


class TickStream:
    """Any tick policy behind the streaming interface: the batches submitted since the last
    `collect` go to the policy in one `act` call (so a scripted policy plays a continuous run
    exactly as it plays ticks)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._submitted: list[tuple[int, list[Turn]]] = []

    def submit(self, tag: int, turns: Sequence[Turn]) -> None:
        self._submitted.append((tag, list(turns)))

    def collect(self) -> list[tuple[int, list[TurnOutput]]]:
        batches, self._submitted = self._submitted, []
        if not batches:
            raise ValueError("collect: no batch was submitted")
        flat = [t for _, turns in batches for t in turns]
        outputs = self.policy.act(flat)
        if len(outputs) != len(flat):
            raise ValueError(f"policy returned {len(outputs)} outputs for {len(flat)} turns")
        out, start = [], 0
        for tag, turns in batches:
            out.append((tag, list(outputs[start:start + len(turns)])))
            start += len(turns)
        return out

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        return self.policy.act(turns)

    def release(self, key: AgentKey) -> None:
        self.policy.release(key)

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        self.policy.prefill_shared(keys, prefix)


@dataclasses.dataclass(frozen=True)
class Step:
    """One scripted turn: free text, then calls (tool name, args)."""

    text: str = ""
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()


class ScriptedPolicy:
    """Turns a deterministic `script(view) -> Step` into token outputs in the chat format."""

    def __init__(self, chat: ChatFormat, script: Callable[[AgentView], Step]):
        self.chat = chat
        self.script = script

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        out = []
        for turn in turns:
            step = self.script(turn.view)
            ids = self.chat.output(step.text, [format_call(n, a, json_call=self.chat.json_calls)
                                               for n, a in step.calls])
            out.append(scripted_output(ids, turn.max_new_tokens))
        return out

    def release(self, key: AgentKey) -> None:
        pass

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        pass


WAIT = Step(calls=(("wait_for_messages", {}),))


class Playbook:
    """A script: agent id -> its steps in turn order; `default` once they run out.

    Summary turns answer with `summary_text`. Usable as `ScriptedPolicy(chat, Playbook(...))`.
    """

    def __init__(self, steps: Mapping[str, Sequence[Step]], default: Step = WAIT,
                 summary_text: str = "summary"):
        self.steps = {k: list(v) for k, v in steps.items()}
        self.default = default
        self.summary_text = summary_text

    def __call__(self, view: AgentView) -> Step:
        if view.summary:
            return Step(self.summary_text)
        steps = self.steps.get(view.key.agent, [])
        return steps[view.turn] if view.turn < len(steps) else self.default


class RoutedPolicy:
    """Sends each turn to `policies[choose(key)]`: one `act` call per policy per tick."""

    def __init__(self, policies: Sequence[Policy], choose: Callable[[AgentKey], int]):
        self.policies = list(policies)
        self.choose = choose

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        groups: dict[int, list[int]] = {}
        for i, turn in enumerate(turns):
            groups.setdefault(self.choose(turn.key), []).append(i)
        out: list[TurnOutput | None] = [None] * len(turns)
        for p, idx in sorted(groups.items()):
            for i, result in zip(idx, self.policies[p].act([turns[i] for i in idx]), strict=True):
                out[i] = result
        return out

    def release(self, key: AgentKey) -> None:
        self.policies[self.choose(key)].release(key)

    def prefill_shared(self, keys: Sequence[AgentKey], prefix: np.ndarray) -> None:
        for p in sorted({self.choose(k) for k in keys}):
            self.policies[p].prefill_shared([k for k in keys if self.choose(k) == p], prefix)
