"""Organisations of the tiny model through the real engine (`avalon/inference/engine.py`).

A random tiny model cannot write a hire, so the CEO is scripted (a `RoutedPolicy`) and every
specialist is the model: each tick's specialist turns, across all rollouts, go to the engine in
one `generate`. The engine's dispatches per call are ceil(longest prompt / prefill_chunk)
prefill chunks + ceil(longest turn / steps_per_dispatch) decode scans, whatever the number of
turns; the tests count them per tick.

Compile cost. Each new (rows, KV capacity, chunk) shape compiles the engine's prefill and
decode (about 7 s each for tiny on 2 CPU cores). The default test keeps one shape: at most 8
turns per call (one row bucket), 8-token prefill chunks, and specialists' contexts between 256
and 512 tokens (one KV bucket; their briefs are long for that). The full done-when run
(16 rollouts x (1 + up to 8) agents) crosses several buckets and is marked slow.
"""

import math
import re

import jax
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams
from avalon.inference.engine import PIPELINE_DEPTH, Engine
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.org.policy import RoutedPolicy, ScriptedPolicy, Step
from avalon.org.schedule import verify_schedule
from avalon.org.tools import OrgTool
from avalon.tokenizer import ChatFormat, WordTokenizer
from tests.org.toyenv import PartsEnv

WINDOW = 512
CFG = M.presets.get("tiny", max_context=WINDOW)
# 25 words fill the tiny vocabulary (128 = 5 specials + byte escape + 97 characters + words).
CHAT = ChatFormat(WordTokenizer([t.value for t in OrgTool] + ["title", "role", "tools", "work"]))
ORG = OrgConfig.scaled(WINDOW, prompt_style=PromptStyle.MINIMAL, max_turns=3,
                       compaction_ratio=0.55, elide_target_ratio=0.45, max_new_tokens=128,
                       summary_cap=16)
HIRE = ("hire", {"title": "w", "role": "w", "tools": []})
PAD = " " + "brief " * 30  # long specialist briefs: contexts start above 256 tokens


def ceo_script(first_wave):
    """Hires `first_wave(budget)` specialists in its first turn, the rest in its second."""

    budgets = {}

    def script(view):
        if view.summary:
            return Step("s")
        key = view.key.rollout
        if view.turn == 0:
            budgets[key] = int(re.search(r"Budget: (\d+)", view.obs).group(1))
            return Step("", (HIRE,) * first_wave(budgets[key]))
        if view.turn == 1:
            rest = budgets[key] - first_wave(budgets[key])
            return Step("", (HIRE,) * rest + (("wait_for_messages", {}),))
        return Step("", (("wait_for_messages", {}),))

    return script


class Counted:
    """The engine policy, recording per tick: turns, generate calls, dispatches, prompts."""

    def __init__(self, policy, engine):
        self.policy, self.engine, self.ticks = policy, engine, []

    def act(self, turns):
        before = self.engine.stats.snapshot()
        out = self.policy.act(turns)
        after = self.engine.stats
        self.ticks.append(dict(
            turns=len(turns), generate=after.generate_calls - before.generate_calls,
            prefill=after.prefill_dispatches - before.prefill_dispatches,
            decode=after.decode_dispatches - before.decode_dispatches,
            longest_prompt=max(len(t.new_tokens) for t in turns),
            longest_turn=max(len(o.tokens) for o in out)))
        return out

    def release(self, key):
        self.policy.release(key)

    def prefill_shared(self, keys, prefix):
        self.policy.prefill_shared(keys, prefix)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), CFG)


def _run(params, budgets, num_slots, first_wave, max_new, max_agents=None):
    engine = Engine(CFG, params, num_slots=num_slots, max_context=WINDOW, steps_per_dispatch=8,
                    prefill_chunk=8)
    model = Counted(EnginePolicy(engine, CHAT, SamplingParams(temperature=1.0),
                                 max_new_tokens=max_new), engine)
    policy = RoutedPolicy([ScriptedPolicy(CHAT, ceo_script(first_wave)), model],
                          lambda key: 0 if key.agent == "ceo" else 1)
    envs = [PartsEnv(brief_pad=PAD) for _ in budgets]
    group = GroupSpec(0, tuple(RolloutSpec(e, b, seed=i) for i, (e, b) in
                               enumerate(zip(envs, budgets))))
    driver = RolloutDriver(policy, CHAT, ORG, max_agents=max_agents)
    return driver.run([group]), model.ticks, engine


def _check(result, ticks, engine, budgets):
    assert CHAT.tok.vocab_size == CFG.vocab_size
    driver_turns = [t.turns for t in result.ticks]
    assert len(ticks) <= len(driver_turns)
    for t in ticks:
        assert t["generate"] == 1  # every model turn of the tick in one call
        # Dispatches depend on the longest prompt and turn, not on how many agents acted.
        assert t["prefill"] == math.ceil(t["longest_prompt"] / engine.prefill_chunk)
        # Decoding waits for no more than one prompt chunk: rows whose prompt ended early
        # sample between the longer prompts' chunks (at most a pipeline's worth per gap), and
        # the longest turn needs its own dispatches after the last chunk.
        turn = math.ceil(t["longest_turn"] / engine.steps_per_dispatch)
        assert turn <= t["decode"] <= turn + PIPELINE_DEPTH * (t["prefill"] - 1)
    assert len({t["turns"] for t in ticks}) > 1  # ticks with different numbers of agents
    rollouts = result.groups[0].rollouts
    assert [r.hires for r in rollouts] == list(budgets)
    n_moe = CFG.count("E")
    for r in rollouts:
        for row in r.rows:
            if row.agent == "ceo":
                assert row.routing is None  # scripted
                continue
            assert row.routing.shape == (len(row.tokens), n_moe, CFG.num_experts_per_tok)
            sampled = row.sampler_logp[row.loss_mask]
            assert len(sampled) and (sampled <= 0).all() and (sampled < 0).any()
            assert (row.tokens < CFG.vocab_size).all()
    assert not engine._allocated.any()  # every slot released


@pytest.mark.slow  # ~15 s warm, ~50 s cold (.ci/run runs it)
@pytest.mark.ci
def test_tiny_engine_one_call_per_tick(params):
    budgets = (0, 1, 2, 3)
    result, ticks, engine = _run(params, budgets, num_slots=8, first_wave=lambda b: b // 2,
                                 max_new=8)
    _check(result, ticks, engine, budgets)
    assert max(t["turns"] for t in ticks) <= 8


@pytest.mark.slow  # ~9 min on a loaded core: each wave's row and width buckets compile
def test_more_agents_than_slots_run_in_waves(params):
    """4 rollouts with 8 specialists in all on an engine of 4 slots: all at once the engine
    runs out of slots; admitted as room frees up (max_agents = slots) every rollout plays to
    its end with its hires, and every slot comes back."""
    budgets = (1, 2, 3, 2)
    with pytest.raises(ValueError, match="all 4 slots are in use"):
        _run(params, budgets, num_slots=4, first_wave=lambda b: b, max_new=8)
    result, ticks, engine = _run(params, budgets, num_slots=4, first_wave=lambda b: b,
                                 max_new=8, max_agents=4)
    assert [r.hires for r in result.groups[0].rollouts] == list(budgets)
    assert max(t["turns"] for t in ticks) <= 3  # the largest rollout's specialists
    assert not engine._allocated.any()


@pytest.mark.slow
def test_sixteen_rollouts_of_up_to_nine_agents(params):
    budgets = tuple(i % 9 for i in range(16))  # 0..8 hires: 1 to 9 agents per organisation
    result, ticks, engine = _run(params, budgets, num_slots=16 * 9,
                                 first_wave=lambda b: (b + 1) // 2, max_new=16)
    _check(result, ticks, engine, budgets)
    # Clock scheduler: a call holds the agents at the front of each rollout's clock, several
    # per rollout when their clocks are close (the driver checked every rollout's scheduled
    # clocks against the replay of its log).
    assert max(t["turns"] for t in ticks) > 16
    for group, scheds in zip(result.logs, result.scheduled):
        for log, sched in zip(group, scheds):
            verify_schedule(log.events, sched, clock_order=True)
            assert len(sched) >= sum(e["kind"] == "model_call" for e in log.events)
    assert {r.metrics["agents"] for r in result.groups[0].rollouts} == set(range(1, 10))
