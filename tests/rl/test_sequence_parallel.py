"""Sequence parallelism in the update step (`RLConfig.sequence_parallel`, TRAIN_SEQ_RULES): each
row's positions split over `expert`, Mamba and attention switching to whole rows with a share
of the heads. The step on an fsdp 2 x expert 4 mesh equals the single-device step (metrics and
new params), with packed segments crossing the chips' position boundaries, the chunked
log-probs over split positions, and expert-parallel MoE on the split tokens."""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.model import AttentionImpl, Remat
from avalon.rl.build import build_rl_batch
from avalon.rl.config import RLConfig
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.rl.helpers import make_group, make_rollout, make_row

# Mamba (8 heads, 2 groups: split 4 and replicated), MoE, attention (4 q heads split 4, 2 kv
# heads whole): every layer kind whose layout changes under the position split.
CFG = M.presets.get("tiny", pattern="ME*")
ROUTING = (CFG.count("E"), CFG.num_experts_per_tok)
SEQ = 32
# Dropless: which choices a capacity drops depends on which tokens share a chip, which the
# position split changes. adam_eps as in test_update.py (compare gradients, not Adam's slope).
# logprob_chunk 4 < the 8 positions per chip: the chunked path over split positions.
RL = RLConfig(lr=1e-3, weight_decay=0.1, adam_eps=1e-5, logprob_chunk=4,
              moe_capacity_factor=None)


def _batch():
    rng = np.random.default_rng(3)
    groups = [make_group(g, [make_rollout([make_row(rng, int(rng.integers(5, SEQ)),
                                                    agent=f"a{j}", routing_shape=ROUTING)
                                           for j in range(3)], [float(r * (g + 1))])
                             for r in range(3)]) for g in range(2)]
    batch, _ = build_rl_batch(groups, RL, seq_len=SEQ, num_seqs_multiple=4,
                              routing_shape=ROUTING)
    return batch


# The model's defaults (naive attention, no remat), and the pod's path: the causal-scan
# attention in blocks smaller than a chip's whole row, per-layer (selective) remat, the Mamba
# mixer in blocks of positions (2 per row).
# The pod variant compiles for ~50 s of one core: slow (its parts, the causal scan, the
# selective remat and the blocked mixer, have fast tests of their own in tests/model/).
@pytest.mark.parametrize("variant", [
    {}, pytest.param({"attention_impl": AttentionImpl.CAUSAL_SCAN, "attention_query_chunk": 8,
                      "remat": Remat.SELECTIVE, "ssd_block": 16}, marks=pytest.mark.slow)],
    ids=["default", "pod"])
def test_sequence_parallel_step_matches_single_device(variant):
    cfg = CFG.replace(**variant)
    batch = _batch()
    # Packed rows: some segment runs across a boundary between two chips' positions.
    seg = np.asarray(batch.segment_ids)
    part = SEQ // 4
    assert any(seg[r, i * part - 1] == seg[r, i * part] > 0
               for r in range(seg.shape[0]) for i in range(1, 4))
    params = M.init_params(jax.random.key(2), cfg)
    single = make_update_step(cfg, RL)
    mesh = make_mesh({"fsdp": 2, "expert": 4})
    sharded = make_update_step(cfg, RL.replace(micro_batches=2, sequence_parallel=True),
                               mesh=mesh)
    assert sharded.batch_sharding.spec == jax.sharding.PartitionSpec("fsdp", "expert")
    ref_state, ref_m = single(single.init_state(params), batch)
    state, m = sharded(sharded.init_state(params), batch)
    for key in ref_m:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=2e-5, atol=1e-6, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(jax.device_get(ref_state.params)),
                            jax.tree.leaves(jax.device_get(state.params))):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    # The log-prob pass (no gradient) under the same rules.
    ref_logp, _ = single.logprobs(params, batch)
    logp, _ = sharded.logprobs(params, batch)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(ref_logp), rtol=1e-5, atol=1e-5)


def test_rows_not_divisible_over_the_position_split_are_a_clear_error():
    batch = _batch()
    step = make_update_step(CFG, RL.replace(sequence_parallel=True),
                            mesh=make_mesh({"fsdp": 2, "expert": 4}))
    with pytest.raises(ValueError, match=r"30 positions.*multiple of the 4 chips"):
        step.put_batch(jax.tree.map(lambda x: x[:, :30], batch))
