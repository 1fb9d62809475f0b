"""End to end with the engine: turns sampled by `avalon.inference.Engine` (multi-turn contexts:
prompt, sampled reply, tool result, ...), packed into a training batch, replayed through the
trainer's forward: every importance ratio is 1 up to float error. Slow (the engine compiles a
prefill and a decode program per bucket); run with `-m slow`."""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.rl.build import build_rl_batch
from avalon.rl.config import RLConfig
from avalon.rl.types import TrajectoryRow
from avalon.rl.update import make_update_step
from tests.rl.helpers import make_group, make_rollout

CFG = M.presets.get("tiny")


@pytest.mark.slow
def test_engine_rollouts_give_ratio_one_with_routing_replay():
    params = M.init_params(jax.random.key(0), CFG)
    scale = {"experts_up": 10.0, "experts_down": 10.0, "router": 20.0}
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale.get(path[-1].key, 1.0), params)
    engine = Engine(CFG, params, num_slots=8, max_context=128)
    rng = np.random.default_rng(0)
    slots = [engine.allocate() for _ in range(4)]
    parts = {s: [] for s in slots}  # (tokens, sampled?, logp, routing) per turn piece
    for turn in range(3):
        reqs = [TurnRequest(slot=s, max_new_tokens=int(rng.integers(4, 12)),
                            new_tokens=rng.integers(0, CFG.vocab_size, int(rng.integers(3, 9)),
                                                    dtype=np.int32),
                            sampling=SamplingParams(seed=100 + s + 10 * turn)) for s in slots]
        for q, r in zip(reqs, engine.generate(reqs)):
            n_in = len(q.new_tokens)
            parts[q.slot].append((q.new_tokens, np.zeros(n_in, bool), np.zeros(n_in, np.float32),
                                  r.routing[:n_in]))
            parts[q.slot].append((r.tokens, np.ones(len(r.tokens), bool), r.logprobs,
                                  r.routing[n_in:]))
    rows = []
    for s in slots:
        tokens, mask, logp, routing = (np.concatenate(x) for x in zip(*parts[s]))
        rows.append(TrajectoryRow(tokens.astype(np.int32), mask, logp.astype(np.float32),
                                  routing.astype(np.int32), np.zeros(len(tokens), np.int8),
                                  agent=f"a{s}", role="R"))
    rl_cfg = RLConfig(logprob_chunk=16)
    group = make_group(0, [make_rollout(rows[:2], [1.0]), make_rollout(rows[2:], [0.0])])
    batch, stats = build_rl_batch([group], rl_cfg, seq_len=128,
                                  routing_shape=(CFG.count("E"), CFG.num_experts_per_tok))
    assert stats.packing.loss_tokens == sum(int(r.loss_mask[1:].sum()) for r in rows)
    logp, _ = make_update_step(CFG, rl_cfg).logprobs(params, batch)
    mask = batch.loss_mask
    ratio = np.exp(np.asarray(logp)[mask] - batch.old_logp[mask])
    # Measured: |log ratio| <= 4.3e-6 (fp32, engine decode path vs training chunked path).
    np.testing.assert_allclose(ratio, 1.0, rtol=0, atol=2e-5)
