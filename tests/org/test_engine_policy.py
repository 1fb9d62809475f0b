"""The engine policy against a fake engine that records every request: one `generate` per
tick, only new tokens sent, slots per context segment, prefix sharing by fork, and rows that
equal the engine's contexts token for token (with their log-probs and routing)."""

import numpy as np
import pytest

from avalon.inference.api import EngineStats, SamplingParams, StopReason, TurnResult
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.org.toolcall import format_call
from tests.org.helpers import CHAT
from tests.org.toyenv import PartsEnv

N_MOE, TOP_K = 2, 2


class FakeEngine:
    """Slots hold token lists; `respond(context) -> output ids` plays the model."""

    def __init__(self, respond, num_slots=64):
        self.respond = respond
        self.contexts: dict[int, list[int]] = {}
        self.free = list(range(num_slots))
        self.lifetimes: list[dict] = []  # every slot lifetime, closed at release
        self.live: dict[int, dict] = {}
        self.requests: list[list] = []  # per generate call
        self.stats = EngineStats()

    def allocate(self):
        slot = self.free.pop(0)
        self.contexts[slot] = []
        self.live[slot] = {"slot": slot, "logp": [], "routing": [], "sent": [], "out": [],
                           "prefix": 0}
        return slot

    def release(self, slot):
        life = self.live.pop(slot)
        life["tokens"] = self.contexts.pop(slot)
        self.lifetimes.append(life)
        self.free.insert(0, slot)

    def fork(self, slot, k):
        new = []
        for _ in range(k):
            s = self.allocate()
            self.contexts[s] = list(self.contexts[slot])
            src = self.live[slot]
            self.live[s] = {"slot": s, "logp": list(src["logp"]), "routing": list(src["routing"]),
                            "sent": [], "out": [], "prefix": len(self.contexts[slot])}
            new.append(s)
        self.stats.forks += 1
        return new

    def generate(self, requests):
        self.requests.append(list(requests))
        self.stats.generate_calls += 1
        out = []
        for r in requests:
            ctx = self.contexts[r.slot]
            ctx += [int(x) for x in r.new_tokens]
            toks = self.respond(ctx)[:r.max_new_tokens] if r.max_new_tokens else []
            ctx += toks
            logp = [-0.01 * (len(ctx) - len(toks) + i) for i in range(len(toks))]
            n = len(r.new_tokens) + len(toks)
            start = len(ctx) - n
            routing = np.array([[[(start + i) % 8, (start + i + j) % 8] for j in range(N_MOE)]
                                for i in range(n)], np.int16).reshape(n, N_MOE, TOP_K)
            life = self.live[r.slot]
            life["sent"].append(len(r.new_tokens))
            life["out"].append(len(toks))
            life["logp"] += [0.0] * len(r.new_tokens) + logp
            life["routing"].append(routing)
            stop = StopReason.STOP if toks and toks[-1] == CHAT.end_id else StopReason.LENGTH
            out.append(TurnResult(slot=r.slot, tokens=np.array(toks, np.int32),
                                  logprobs=np.array(logp, np.float32), routing=routing,
                                  stop_reason=stop, n_in_new=len(r.new_tokens),
                                  context_length=len(ctx)))
        return out


def respond(ctx):
    """A model that follows the format: the CEO hires two, then finishes once both reported;
    a specialist writes a long note each turn until it has compacted once, then reports."""
    text = CHAT.tok.decode(ctx)
    me = text.split("You are ", 1)[1].split(",", 1)[0]
    turns = text.count("<|agent|>")
    if me == "ceo":
        if turns == 1:
            calls = [format_call("hire", {"title": "w", "role": "r", "tools": []})] * 2
        elif text.count("report a") >= 2 or "Summary of your work" in text:
            calls = [format_call("final_message", {"text": "done"})]
        else:
            calls = [format_call("wait_for_messages")]
        return CHAT.output("ok", calls)
    if "Context full" in text.rsplit("<|obs|>", 1)[1]:
        return CHAT.output("summary of my notes")
    if "Summary of your work" in text:
        return CHAT.output("", [format_call("report_to_ceo", {"status": "ok"}),
                                format_call("wait_for_messages")])
    return CHAT.output("n" * 150, [format_call("roster")])


CFG = OrgConfig.scaled(2048, prompt_style=PromptStyle.COMPACT, max_new_tokens=200,
                       compaction_ratio=0.75, elide_target_ratio=0.6)


@pytest.fixture(scope="module")
def run():
    engine = FakeEngine(respond)
    policy = EnginePolicy(engine, CHAT, SamplingParams(temperature=0.7, seed=5))
    calls = []

    class Counting:
        def act(self, turns):
            before = engine.stats.generate_calls
            out = policy.act(turns)
            calls.append((len(turns), engine.stats.generate_calls - before))
            return out

        def release(self, key):
            policy.release(key)

        def prefill_shared(self, keys, prefix):
            policy.prefill_shared(keys, prefix)

    groups = [GroupSpec(g, tuple(RolloutSpec(PartsEnv(), 2, seed=10 * g + i) for i in range(3)))
              for g in range(2)]
    result = RolloutDriver(Counting(), CHAT, CFG).run(groups)
    return result, engine, calls


def test_one_generate_per_tick(run):
    result, engine, calls = run
    assert [n for n, _ in calls] == [t.turns for t in result.ticks if t.turns]
    assert all(g == 1 for _, g in calls)
    assert max(n for n, _ in calls) >= 12  # 6 rollouts' specialists together


def test_every_slot_released_and_rows_equal_engine_contexts(run):
    result, engine, _ = run
    assert not engine.live  # every slot released by the end
    rows = [r for g in result.groups for ro in g.rollouts for r in ro.rows]
    lives = [life for life in engine.lifetimes if life["tokens"]]
    assert len(rows) == len(lives)
    by_tokens = {}
    for life in lives:
        by_tokens.setdefault(tuple(life["tokens"]), []).append(life)
    for row in rows:
        matches = by_tokens[tuple(row.tokens.tolist())]
        life = matches.pop(0)
        np.testing.assert_array_equal(row.sampler_logp, np.asarray(life["logp"], np.float32))
        np.testing.assert_array_equal(row.routing, np.concatenate(life["routing"]))
        assert (row.sampler_logp[~row.loss_mask] == 0).all()


def test_only_new_tokens_are_sent(run):
    result, engine, _ = run
    # Each slot receives its context exactly once: what was sent plus what it sampled (plus a
    # forked prefix) is the whole context.
    for life in engine.lifetimes:
        assert life["prefix"] + sum(life["sent"]) + sum(life["out"]) == len(life["tokens"])
    # ... and what was sent per turn is the turn's n_in_new in the log.
    for g, logs in zip(result.groups, result.logs):
        for rollout, log in zip(g.rollouts, logs):
            for row in rollout.rows:
                calls = [e for e in log.events if e["kind"] == "model_call"
                         and e["agent"] == row.agent and e["segment"] == row.segment]
                assert sum(c["n_in_new"] + c["n_out"] for c in calls) == len(row.tokens)


def test_compaction_takes_a_new_slot(run):
    result, engine, _ = run
    comps = [e for logs in result.logs for log in logs for e in log.events
             if e["kind"] == "compaction"]
    assert comps  # the specialists' notes fill the window
    rows = [r for g in result.groups for ro in g.rollouts for r in ro.rows]
    n_agents = sum(int(ro.metrics["agents"]) for g in result.groups for ro in g.rollouts)
    assert len(rows) == n_agents + len(comps)
    # One slot lifetime per row: compaction released the old slot and took a new one (the
    # group's shared-prefix slot became its first CEO's).
    assert len(engine.lifetimes) == len(rows)


def test_prefix_shared_by_fork(run):
    result, engine, _ = run
    prefill_only = [call for call in engine.requests if call[0].max_new_tokens == 0]
    assert len(prefill_only) == 2 and all(len(c) == 1 for c in prefill_only)
    assert engine.stats.forks == 2
    for g, call in zip(result.groups, prefill_only):
        prefix = call[0].new_tokens
        for rollout in g.rollouts:
            ceo = next(r for r in rollout.rows if r.agent == "ceo" and r.segment == 0)
            np.testing.assert_array_equal(ceo.tokens[:len(prefix)], prefix)
    # No turn re-sent the shared prefix: the CEOs' first turns sent only what follows it.
    firsts = [r for call in engine.requests for r in call if r.max_new_tokens]
    ceo_system = prefill_only[0][0].new_tokens
    assert not any(len(r.new_tokens) >= len(ceo_system) and
                   np.array_equal(r.new_tokens[:len(ceo_system)], ceo_system) for r in firsts)


def test_sampling_seed_and_stop_token(run):
    _, engine, _ = run
    reqs = [r for call in engine.requests for r in call if r.max_new_tokens]
    assert all(r.stop_tokens == (CHAT.end_id,) for r in reqs)
    assert all(r.sampling.temperature == 0.7 for r in reqs)
    seeds = [r.sampling.seed for r in reqs]
    assert len(set(seeds)) == len(seeds)  # per (rollout, agent, model call)


def test_cap_and_mismatch_errors():
    engine = FakeEngine(lambda ctx: CHAT.output("x" * 50))
    policy = EnginePolicy(engine, CHAT, max_new_tokens=7)
    result = RolloutDriver(policy, CHAT, CFG, share_prefix=False).run(
        [GroupSpec(0, (RolloutSpec(PartsEnv(), 0, 0),))])
    assert all(r.max_new_tokens <= 7 for call in engine.requests for r in call)
    assert result.groups[0].rollouts[0].metrics["model_calls"] > 0
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        EnginePolicy(engine, CHAT, max_new_tokens=0)

    class Short(FakeEngine):
        def generate(self, requests):
            return [TurnResult(r.slot, np.zeros(0, np.int32), np.zeros(0, np.float32), None,
                               StopReason.CONTEXT_FULL, 0, 0) for r in requests]

    with pytest.raises(RuntimeError, match="max_context is smaller"):
        RolloutDriver(EnginePolicy(Short(None), CHAT), CHAT, CFG).run(
            [GroupSpec(0, (RolloutSpec(PartsEnv(), 0, 0),))])
