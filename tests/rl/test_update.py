"""The update step: frozen router, non-finite guard, on-policy ratios, sharded == unsharded,
SFT through the same step."""

import re

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.backends.training import CPU_COMPILER_OPTIONS
from avalon.rl.batch import TrainBatch
from avalon.rl.build import build_rl_batch, build_sft_batch
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.packing import pack_rows
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.rl.helpers import make_group, make_rollout, make_row

# MoE + attention: the parts the step touches (router, replay, segments) at a small compile cost.
CFG = M.presets.get("tiny", pattern="E*")
ROUTING = (CFG.count("E"), CFG.num_experts_per_tok)
# A large lr and weight decay so every trainable leaf visibly moves in one step.
# adam_eps, for sharded == unsharded: Adam's first step moves a param by lr * g / (|g| + eps),
# whose slope at g = 0 is lr / eps. With eps = 1e-8 a 4e-11 rounding difference in a near-zero
# gradient (seen in one element of 16,384 on the full tiny model) moves a param by 4e-6;
# eps = 1e-5 makes that comparison measure the gradients' agreement, not Adam's amplification
# of their rounding.
RL = RLConfig(lr=1e-3, weight_decay=0.1, adam_eps=1e-5, logprob_chunk=16)
SEQ = 32


def _groups(seed=0):
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(2):
        rollouts = []
        for r in range(3):
            rows = [make_row(rng, int(rng.integers(5, SEQ)), agent=f"a{j}", routing_shape=ROUTING)
                    for j in range(int(rng.integers(1, 4)))]
            rollouts.append(make_rollout(rows, [float(r + g)], budget=2, hires=len(rows) - 1))
        groups.append(make_group(g, rollouts))
    return groups


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def batch():
    b, stats = build_rl_batch(_groups(), RL, seq_len=SEQ, num_seqs_multiple=4,
                              routing_shape=ROUTING)
    assert stats.advantages.kept_groups == 2 and b.tokens.shape[0] % 4 == 0
    return b


@pytest.fixture(scope="module")
def single():
    return make_update_step(CFG, RL)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _is_router(path):
    return path[-1].key in ("router", "router_bias")


def test_router_is_bit_identical_after_an_update(single, params, batch):
    assert single.model_cfg.router_frozen
    state, metrics = single(single.init_state(params), batch)
    assert int(metrics["skipped"]) == 0 and int(state.step) == 1
    old, new = _host(params), _host(state.params)
    n_router = 0
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(old), jax.tree.leaves(new)):
        if _is_router(path):
            n_router += 1
            assert a.tobytes() == b.tobytes(), jax.tree_util.keystr(path)
        else:
            assert (a != b).any(), f"{jax.tree_util.keystr(path)} did not move"
    assert n_router == 2
    # No optimizer state (Adam moments) is kept for the frozen leaves.
    opt_paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)]
    assert not any(_is_router(p) for p in opt_paths if hasattr(p[-1], "key"))


def test_non_finite_update_is_skipped_and_reported(single, params, batch):
    state = single.init_state(params)
    before = _host(state)
    fifth = (batch.loss_mask.cumsum() == 5).reshape(batch.loss_mask.shape) & batch.loss_mask
    bad = batch.replace(advantages=np.where(fifth, np.nan, batch.advantages).astype(np.float32))
    new, metrics = single(state, bad)
    assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["grad_norm"]))
    after = _host(new)
    assert int(after.step) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        assert a.tobytes() == b.tobytes()


def test_batch_without_loss_tokens_is_skipped(single, params, batch):
    """Every group dropped: the packer still returns a (padding) batch; the step is a no-op."""
    empty, stats = pack_rows([], SEQ, min_seqs=batch.tokens.shape[0], routing_shape=ROUTING)
    assert stats.loss_tokens == 0 and empty.tokens.shape == batch.tokens.shape
    state = single.init_state(params)
    before = _host(state)
    new, metrics = single(state, empty)
    assert int(metrics["skipped"]) == 1 and int(metrics["loss_tokens"]) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(_host(new))):
        assert a.tobytes() == b.tobytes()


def test_on_policy_batch_has_ratio_one_in_the_step(single, params, batch):
    logp, _ = single.logprobs(params, batch)
    on_policy = batch.replace(old_logp=np.where(batch.loss_mask, np.asarray(logp), 0.0)
                              .astype(np.float32))
    _, m = single(single.init_state(params), on_policy)
    for key in ("ratio_mean", "ratio_max", "ratio_min"):
        assert abs(float(m[key]) - 1.0) <= 1e-5, (key, float(m[key]))
    assert float(m["clipped_frac"]) == 0.0
    assert int(m["loss_tokens"]) == batch.loss_mask.sum()
    adv = batch.advantages[batch.loss_mask]
    np.testing.assert_allclose([m["token_adv_mean"], m["token_adv_min"], m["token_adv_max"]],
                               [adv.mean(), adv.min(), adv.max()], rtol=1e-5, atol=1e-6)


def test_mesh_step_with_micro_batches_matches_single_device(single, params, batch):
    """data=2 x tensor=4 mesh and 2 accumulated micro-batches vs one device, one batch."""
    mesh = make_mesh({"data": 2, "tensor": 4})
    sharded = make_update_step(CFG, RL.replace(micro_batches=2), mesh=mesh)
    ref_state, ref_m = single(single.init_state(params), batch)
    state, m = sharded(sharded.init_state(params), batch)
    leaves = jax.tree.leaves(state.params)
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in leaves)
    for key in ref_m:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=2e-5, atol=1e-6, err_msg=key)
    # Params: fp32 reductions in another order give gradients equal to ~1e-6 relative; a
    # step moves a leaf by at most ~lr = 1e-3 (Adam), so the new params agree to ~lr * 1e-3.
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(_host(ref_state.params)),
                            jax.tree.leaves(_host(state.params))):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_platform_default_dispatch_mesh_step_matches_single_device(single, params):
    """The step with the MoE dispatch each platform runs by default (AUTO; the tests above pin
    tiny to RAGGED_DOT): expert-parallel over fsdp=2 x expert=4, each chip's experts in grouped
    tiles (dropless capacity), equals the single-device RAGGED_DOT step."""
    mesh = make_mesh({"fsdp": 2, "expert": 4})
    # Rows split over all 8 chips (fsdp x expert: the update step's batch rule), so the batch
    # is packed to a multiple of 8 (padding rows carry no loss).
    batch, _ = build_rl_batch(_groups(), RL, seq_len=SEQ, num_seqs_multiple=8,
                              routing_shape=ROUTING)
    auto = make_update_step(CFG.replace(moe_backend=M.MoeBackend.AUTO),
                            RL.replace(moe_capacity_factor=None), mesh=mesh)
    ref_state, ref_m = single(single.init_state(params), batch)
    state, m = auto(auto.init_state(params), batch)
    assert int(m["moe_dropped_choices"]) == 0
    for key in ref_m:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=2e-5, atol=1e-6, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(_host(ref_state.params)),
                            jax.tree.leaves(_host(state.params))):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_profile_names_the_loss_and_the_head(single, params, batch):
    """The update step's ops are named (`jax.named_scope`) after the loss, the log-probs, the LM
    head and each layer kind, in the forward and in the gradient."""
    text = single.step_fn.lower(single.init_state(params), single.put_batch(batch)).as_text(
        debug_info=True)
    scopes = set(re.findall(r"[/(]([a-z_]+)[/)]", text))
    assert {"loss", "logprobs", "head", "moe", "attention"} <= scopes
    assert re.search(r"transpose\(jvp\(moe\)\)", text)  # the backward of an MoE layer


def test_sft_runs_through_the_same_step_and_lowers_nll(params):
    rng = np.random.default_rng(5)
    rows = [make_row(rng, int(rng.integers(8, SEQ)), agent=f"a{i}", loss_frac=0.7)
            for i in range(6)]
    batch, _ = build_sft_batch(rows, seq_len=SEQ, num_seqs_multiple=2)
    step = make_update_step(CFG, RL.replace(loss=LossKind.SFT, lr=1e-2, weight_decay=0.0))
    state = step.init_state(params)
    nll = []
    for _ in range(3):
        state, m = step(state, batch)
        nll.append(float(m["nll"]))
        assert float(m["loss"]) == pytest.approx(nll[-1], rel=1e-6)
        assert "ratio_mean" not in m
    assert nll[0] > nll[1] > nll[2], nll


def test_bad_inputs_are_clear_errors(batch):
    two = make_update_step(CFG, RL.replace(micro_batches=2))
    with pytest.raises(ValueError, match=r"batch has 3 sequences.*multiple of micro_batches"):
        two.put_batch(jax.tree.map(lambda x: x[:3], batch))
    with pytest.raises(ValueError, match=r"ModelConfig.param_dtype='bfloat16'"):
        make_update_step(CFG.replace(param_dtype="bfloat16"), RL)


@pytest.mark.slow
def test_full_tiny_mesh_step_matches_single_device():
    """As above on the full tiny pattern (Mamba-2 with packed segments, MLP, both MoE runs)."""
    cfg = M.presets.get("tiny")
    routing = (cfg.count("E"), cfg.num_experts_per_tok)
    rng = np.random.default_rng(9)
    groups = [make_group(g, [make_rollout([make_row(rng, int(rng.integers(5, SEQ)),
                                                    agent=f"a{j}", routing_shape=routing)
                                           for j in range(2)], [float(r * (g + 1))])
                             for r in range(3)]) for g in range(2)]
    batch, _ = build_rl_batch(groups, RL, seq_len=SEQ, num_seqs_multiple=4,
                              routing_shape=routing)
    params = M.init_params(jax.random.key(1), cfg)
    # Two micro-batches accumulate in another order than one batch: on the full model a
    # near-zero gradient element then differs by ~1e-8, which eps = 1e-5 (slope lr / eps = 100)
    # still turns into 1.2e-6 of param. eps = 1e-4 (slope 10) keeps the comparison about the
    # gradients, as in the test above.
    rl = RL.replace(adam_eps=1e-4)
    single = make_update_step(cfg, rl)
    sharded = make_update_step(cfg, rl.replace(micro_batches=2),
                               mesh=make_mesh({"fsdp": 2, "tensor": 4}))
    ref_state, ref_m = single(single.init_state(params), batch)
    state, m = sharded(sharded.init_state(params), batch)
    for key in ref_m:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=2e-5, atol=1e-6, err_msg=key)
    for a, b in zip(jax.tree.leaves(_host(ref_state.params)), jax.tree.leaves(_host(state.params))):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


def _expected_drops(routing, chips: int, ep: int, e_local: int, cap: int) -> int:
    """Choices past `cap` rows per destination, counted on the host: the batch's replayed
    routing [B, S, m, k], rows split evenly over `chips`, one dispatch chunk per chip and layer
    (a chip's tokens are fewer than moe_dispatch_chunk), destination = expert // e_local."""
    r = np.asarray(routing).astype(np.int64)
    per_chip = r.reshape(chips, -1, *r.shape[2:])  # [chips, tokens, m, k]
    total = 0
    for chip in per_chip:
        for layer in range(chip.shape[1]):
            counts = np.bincount((chip[:, layer] // e_local).reshape(-1), minlength=ep)
            total += int(np.maximum(counts - cap, 0).sum())
    return total


def test_expert_parallel_step_reports_dropped_choices(params, batch):
    """On expert 4 x tensor 2, the step's `moe_dropped_choices` is the host count of choices
    past the capacity (factor 1: C = tokens x k / 4 rows per destination); None drops none."""
    mesh = make_mesh({"expert": 4, "tensor": 2})
    rows, seq = batch.tokens.shape
    assert rows % 4 == 0
    n, k = rows // 4 * seq, CFG.num_experts_per_tok
    want = _expected_drops(batch.routing, 4, 4, CFG.n_routed_experts // 4, n * k // 4)
    assert want > 0
    for factor, expect in ((1.0, want), (None, 0)):
        step = make_update_step(CFG, RL.replace(moe_capacity_factor=factor), mesh=mesh)
        _, m = step(step.init_state(params), batch)
        assert int(m["moe_dropped_choices"]) == expect, factor


def _ynn_fusion_bodies(hlo: str) -> list[str]:
    """The bodies of the computations that the YNNPACK fusions of a compiled module call."""
    called = re.findall(r"calls=%([\w.\-]+)[^\n]*__ynn_fusion", hlo)
    bodies = []
    for name in called:
        start = hlo.index(f"\n%{name} ")
        bodies.append(hlo[start:hlo.index("\n}", start)])
    return bodies


def test_cpu_update_step_compiles_with_ynnpack_for_single_dots_only():
    """On CPU the update step's programs compile with CPU_COMPILER_OPTIONS (YNNPACK's
    reduce fusions were slower than XLA's own): every
    YNNPACK fusion of the compiled step is one dot (no reduce or elementwise fusion); the same
    model compiled with XLA's defaults also fuses reductions into YNNPACK."""
    cfg = M.presets.get("tiny", param_dtype="float32")
    step = make_update_step(cfg, RLConfig(loss=LossKind.SFT))
    assert step.platform.compiler_options == CPU_COMPILER_OPTIONS == {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
    params = M.init_params(jax.random.key(0), cfg)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    batch = step.put_batch(TrainBatch(
        tokens=ids, targets=ids, segment_ids=np.ones_like(ids), loss_mask=np.ones(ids.shape, bool),
        old_logp=np.zeros(ids.shape, np.float32), advantages=np.zeros(ids.shape, np.float32),
        routing=None))
    bodies = _ynn_fusion_bodies(step.step_fn.lower(step.init_state(params), batch)
                                .compile().as_text())
    assert bodies and all(" dot(" in b and " reduce(" not in b for b in bodies)
    default = jax.jit(lambda p, x: M.forward(p, x, cfg).logits).lower(params, ids)
    assert any(" reduce(" in b for b in _ynn_fusion_bodies(default.compile().as_text()))
