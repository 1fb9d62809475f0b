"""Continuous feeding (`RolloutDriver(continuous=True)`): each rollout's next batch goes to the
policy as soon as its last one came back, while other rollouts' turns still run.

Against the tick driver: a scripted organisation's logs are byte-identical however the
batches come back (here, a policy that hands back only the most recently submitted batch, so
fast rollouts play many batches while a slow one waits); with the real engine (tiny model),
the same tokens and logs for every rollout, with turns submitted while others were decoding.
(Speed is measured in `experiments/bench/`, not here.)"""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams
from avalon.inference.engine import Engine
from avalon.org import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.org.policy import ScriptedPolicy, TickStream
from tests.org.helpers import CHAT
from tests.org.test_driver import CFG, Delegating, _groups
from tests.org.test_engine_tiny import CFG as TINY
from tests.org.test_engine_tiny import CHAT as WORDS
from tests.org.test_engine_tiny import ORG, WINDOW
from tests.org.toyenv import PartsEnv


class LastInFirstOut(TickStream):
    """A streaming policy that finishes one batch per `collect`: the newest submitted."""

    def __init__(self, policy):
        super().__init__(policy)
        self.max_running = 0

    def collect(self):
        self.max_running = max(self.max_running, len(self._submitted))
        tag, turns = self._submitted.pop()
        return [(tag, self.policy.act(turns))]


def _logs(result):
    return [[log.jsonl() for log in group] for group in result.logs]


def test_scripted_logs_are_byte_identical_to_ticks_however_batches_return():
    ticks = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG).run(_groups())
    plain = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG,
                          continuous=True).run(_groups())
    lifo = LastInFirstOut(ScriptedPolicy(CHAT, Delegating()))
    reordered = RolloutDriver(lifo, CHAT, CFG, continuous=True).run(_groups())
    assert lifo.max_running == 8  # every rollout had a batch out at once
    for got in (plain, reordered):
        assert _logs(got) == _logs(ticks)
        assert [[r.rewards for r in g.rollouts] for g in got.groups] == \
            [[r.rewards for r in g.rollouts] for g in ticks.groups]
    # Per batch, not per tick: as many policy batches as the ticks' rollout-turn groups.
    assert sum(t.turns for t in reordered.ticks) == sum(t.turns for t in ticks.ticks)
    waves = RolloutDriver(LastInFirstOut(ScriptedPolicy(CHAT, Delegating())), CHAT, CFG,
                          continuous=True, max_agents=5).run(_groups())
    assert _logs(waves) == _logs(ticks)


# The real engine: single agents of the random tiny model (it cannot write a hire), so each
# rollout is a run of CEO turns of sampled lengths, cut at `max_new_tokens`.
# (test_engine_tiny's model, vocabulary and window.)
class SubmitWhileBusy(EnginePolicy):
    """Counts the batches submitted while the engine was serving others."""

    joined = 0

    def submit(self, tag, turns):
        self.joined += bool(self.engine.busy)
        super().submit(tag, turns)


def _engine_run(params, continuous, max_agents=None):
    engine = Engine(TINY, params, num_slots=8, max_context=WINDOW, steps_per_dispatch=8,
                    prefill_chunk=64)
    policy = SubmitWhileBusy(engine, WORDS, SamplingParams(temperature=1.0), max_new_tokens=24)
    groups = [GroupSpec(g, tuple(RolloutSpec(PartsEnv(task_id=f"t{g}"), 0, seed=10 * g + i)
                                 for i in range(2))) for g in range(2)]
    result = RolloutDriver(policy, WORDS, ORG, continuous=continuous,
                           max_agents=max_agents).run(groups)
    assert not engine._allocated.any()  # every slot released
    return result, engine.stats, policy


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), TINY)


@pytest.mark.slow  # ~30 s warm, ~75-110 s cold: the engine three ways (.ci/run runs it)
@pytest.mark.ci
def test_engine_fed_continuously_samples_the_same_turns_as_ticks(params):
    tick, tick_stats, _ = _engine_run(params, continuous=False)
    cont, cont_stats, policy = _engine_run(params, continuous=True)
    lengths = set()
    for g_tick, g_cont in zip(tick.groups, cont.groups):
        for a, b in zip(g_tick.rollouts, g_cont.rollouts):
            assert len(a.rows) == len(b.rows)
            for ra, rb in zip(a.rows, b.rows):
                np.testing.assert_array_equal(ra.tokens, rb.tokens)
                np.testing.assert_allclose(ra.sampler_logp, rb.sampler_logp, atol=1e-5)
                lengths.add(len(ra.tokens))
    assert _logs(cont) == _logs(tick)
    assert policy.joined > 0  # batches joined running dispatches
    assert len(lengths) > 1  # turns of different lengths
    # Only the groups' shared prefixes went through `generate` (nothing was running yet);
    # the ticks made one call per tick besides.
    assert cont_stats.generate_calls == 2 < tick_stats.generate_calls
    # Admitted in waves (2 agents for 4 rollouts): the second group's shared prefix is
    # prefilled while the first group's turns decode, and nothing changes.
    waves, wave_stats, _ = _engine_run(params, continuous=True, max_agents=2)
    assert wave_stats.generate_calls == 1
    assert _logs(waves) == _logs(tick)
