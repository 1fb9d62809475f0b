"""A KV pool at its ceiling (`engine.max_kv_pages`) refusing a prompt: a penalised turn, not an
exception. Two specialists of the tiny model on an engine whose pool holds one context: the
second's prompt finds the pool full of the first's idle context, the engine ends it POOL_FULL
with nothing absorbed, the organisation logs a malformed (refused) turn and stops that agent,
and the rollout plays to its end."""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams, StopReason
from avalon.inference.engine import Engine
from avalon.org import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.org.organisation import POOL_REFUSED
from avalon.org.policy import RoutedPolicy, ScriptedPolicy, Step
from avalon.rl.types import trained_mask
from tests.org.test_engine_tiny import CFG, CHAT, HIRE, ORG, PAD, WINDOW
from tests.org.toyenv import PartsEnv


def _ceo(view):
    if view.turn == 0:
        return Step("", (HIRE, HIRE))
    return Step("", (("wait_for_messages", {}),))


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), CFG)


def test_a_prompt_the_full_pool_refuses_is_a_penalised_turn(params):
    # A specialist's first context is ~300 tokens (its long brief): 20 pages of 16. A ceiling
    # of 32 pages holds one such context and its turn, never two.
    engine = Engine(CFG, params, num_slots=4, max_context=WINDOW, steps_per_dispatch=8,
                    prefill_chunk=64, kv_pages=32, max_kv_pages=32)
    model = EnginePolicy(engine, CHAT, SamplingParams(temperature=1.0), max_new_tokens=8)
    policy = RoutedPolicy([ScriptedPolicy(CHAT, _ceo), model],
                          lambda key: 0 if key.agent == "ceo" else 1)
    result = RolloutDriver(policy, CHAT, ORG).run(
        [GroupSpec(0, (RolloutSpec(PartsEnv(brief_pad=PAD), 2, seed=0),))])
    events = result.logs[0][0].events
    refused = [e for e in events if e["kind"] == "model_call"
               and e.get("stop") == StopReason.POOL_FULL.value]
    assert len(refused) >= 1, [e for e in events if e["kind"] == "model_call"]
    for e in refused:
        assert e["malformed"] == POOL_REFUSED and e["n_out"] == 0
        stops = [s for s in events if s["kind"] == "stop" and s["agent"] == e["agent"]]
        assert [s["reason"] for s in stops] == ["context_full"]
    assert events[-1]["kind"] == "end"
    assert engine.kv_pages[1] == 32  # never grown past the ceiling
    rollout = result.groups[0].rollouts[0]
    assert rollout.metrics["malformed_turns"] >= len(refused)
    for row in rollout.rows:  # the refused agent's row: its prompt, nothing to train on
        if row.agent in {e["agent"] for e in refused} and not trained_mask(row).any():
            assert row.routing is None or row.routing.shape[0] == len(row.tokens)
            assert np.all(row.sampler_logp == 0)
    assert not engine._allocated.any()  # every slot came back
