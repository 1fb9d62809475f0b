"""One AdamW step over several update calls (`UpdateStep.accumulated`) equals one call on the
whole batch: the recipe's one update per RL step, normalised by the whole batch's tokens."""

import jax
import numpy as np
import pytest

from avalon.rl.packing import pack_rows
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.rl.test_update import CFG, RL, ROUTING, SEQ, _host
from tests.rl.test_update import batch as batch  # noqa: F401  (the module's fixtures)
from tests.rl.test_update import params as params  # noqa: F401
from tests.rl.test_update import single as single  # noqa: F401

# fp32 on both sides: the whole-batch call sums every token's gradient in one reduction, the
# accumulated step one part's at a time, so the gradients agree to ~1e-6 relative and a
# step (Adam at lr 1e-3, eps 1e-5: see test_update.RL) moves a param by at most ~lr, so the
# params agree to ~lr * 1e-6 (atol 1e-6 leaves margin, as the sharded comparison does).
PARAM_ATOL = 1e-6
METRIC_RTOL = 2e-5


def _rows(batch, rows):
    return jax.tree.map(lambda x: np.asarray(x)[rows], batch)


def _parts(batch, sizes):
    """The batch's rows cut into consecutive parts of these sizes."""
    assert sum(sizes) == batch.tokens.shape[0]
    edges = np.cumsum([0, *sizes])
    return [_rows(batch, slice(a, b)) for a, b in zip(edges[:-1], edges[1:])]


def _assert_same_state(got, want):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(_host(want)),
                            jax.tree.leaves(_host(got))):
        np.testing.assert_allclose(b, a, rtol=0, atol=PARAM_ATOL,
                                   err_msg=jax.tree_util.keystr(path))


def _assert_same_metrics(got, want):
    assert set(got) == set(want), set(got) ^ set(want)
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key], np.float64),
                                   np.asarray(want[key], np.float64), rtol=METRIC_RTOL,
                                   atol=1e-6, err_msg=key)


# How the batch's B rows are cut into calls: two halves, one row then the rest, a row a call.
CUTS = {"halves": lambda b: (b // 2, b - b // 2), "one_then_rest": lambda b: (1, b - 1),
        "row_by_row": lambda b: (1,) * b}


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_accumulated_step_equals_one_call_on_the_whole_batch(single, params, batch, cut):
    sizes = CUTS[cut](batch.tokens.shape[0])
    want_state, want_m = single(single.init_state(params), batch)
    got_state, got_m = single.accumulated(single.init_state(params), _parts(batch, sizes),
                                          int(batch.loss_mask.sum()))
    assert int(got_state.step) == int(want_state.step) == 1
    _assert_same_state(got_state.params, want_state.params)
    _assert_same_state(got_state.opt_state, want_state.opt_state)
    _assert_same_metrics(got_m, jax.device_get(want_m))


def test_accumulated_step_on_a_mesh_with_micro_batches(single, params, batch):
    """data=2 x tensor=4, 2 micro-batches per call, two calls: the single-device step."""
    mesh = make_mesh({"data": 2, "tensor": 4})
    sharded = make_update_step(CFG, RL.replace(micro_batches=2), mesh=mesh)
    want_state, want_m = single(single.init_state(params), batch)
    b = batch.tokens.shape[0]
    assert b % 4 == 0 and b > 4  # each call a multiple of micro_batches x data
    got_state, got_m = sharded.accumulated(sharded.init_state(params),
                                           _parts(batch, (4, b - 4)),
                                           int(batch.loss_mask.sum()))
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(got_state.params))
    _assert_same_state(got_state.params, want_state.params)
    _assert_same_metrics(got_m, jax.device_get(want_m))


def test_several_updates_differ_from_one(single, params, batch):
    """The per-call behaviour (each call its own AdamW step over its own tokens) is another
    update: after the first call the second's params are not the sampler's."""
    parts = _parts(batch, (4, batch.tokens.shape[0] - 4))
    state = single.init_state(params)
    for part in parts:
        state, _ = single(state, part)
    one, _ = single.accumulated(single.init_state(params), parts, int(batch.loss_mask.sum()))
    assert int(state.step) == 2 and int(one.step) == 1
    diffs = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(_host(state.params)),
                                                 jax.tree.leaves(_host(one.params)))]
    assert max(diffs) > 1e-4


def test_accumulated_step_without_loss_tokens_changes_nothing(single, params, batch):
    empty, _ = pack_rows([], SEQ, min_seqs=4, routing_shape=ROUTING)
    state = single.init_state(params)
    before = _host(state)
    new, m = single.accumulated(state, [empty, empty], 0)
    assert int(m["skipped"]) == 1 and int(m["loss_tokens"]) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(_host(new))):
        assert a.tobytes() == b.tobytes()


def test_a_non_finite_part_skips_the_whole_step(single, params, batch):
    parts = _parts(batch, (4, batch.tokens.shape[0] - 4))
    bad = parts[1].replace(advantages=np.where(parts[1].loss_mask, np.nan,
                                               parts[1].advantages).astype(np.float32))
    state = single.init_state(params)
    before = _host(state)
    new, m = single.accumulated(state, [parts[0], bad], int(batch.loss_mask.sum()))
    assert int(m["skipped"]) == 1 and int(new.step) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(_host(new))):
        assert a.tobytes() == b.tobytes()


def test_micro_batches_of_padding_only_are_not_run_and_change_nothing(single, params, batch):
    """A call padded with rows of padding (to the micro-batches' multiple) gives the step on
    the real rows alone, and reports each padding-only micro-batch as not run."""
    b = batch.tokens.shape[0]
    pad, _ = pack_rows([], SEQ, min_seqs=3, routing_shape=ROUTING)
    padded = jax.tree.map(lambda x, y: np.concatenate([np.asarray(x), np.asarray(y)]), batch, pad)
    # One row a micro-batch: the three added and the batch's own padding hold no loss token.
    empty = int((~np.asarray(padded.loss_mask).any(axis=1)).sum())
    assert empty >= 3
    step = make_update_step(CFG, RL.replace(micro_batches=b + 3))
    want_state, want_m = single(single.init_state(params), batch)
    got_state, got_m = step(step.init_state(params), padded)
    assert int(got_m["empty_micro_batches"]) == empty and int(want_m["empty_micro_batches"]) == 0
    _assert_same_state(got_state.params, want_state.params)
    _assert_same_state(got_state.opt_state, want_state.opt_state)
    got_m, want_m = dict(jax.device_get(got_m)), dict(jax.device_get(want_m))
    got_m.pop("empty_micro_batches"), want_m.pop("empty_micro_batches")
    _assert_same_metrics(got_m, want_m)
