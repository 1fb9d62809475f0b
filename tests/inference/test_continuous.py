"""Continuous batching and the paged KV pool, through the engine.

Turns are submitted while others decode (`Engine.submit` / `Engine.step`); every result is
checked against full forwards of the slot's whole context (`Tracker.check`, see test_engine.py)
or against the same turn run alone.
"""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams, StopReason, TurnRequest
from avalon.inference.engine import Engine
from avalon.model import param_shardings
from avalon.sharding import DECODE_RULES, make_mesh
from tests.inference.test_engine import CFG, GREEDY, Tracker, _prompt

WINDOW = 128
PAGE = 8


def make_engine(params, num_slots=8, mesh=None):
    return Engine(CFG, params, num_slots=num_slots, max_context=WINDOW, mesh=mesh,
                  steps_per_dispatch=4, prefill_chunk=16, page_size=PAGE)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), M.presets.get("tiny"))


def _serve(eng, tracker, first, later, admit_after):
    """Submit `first`; after `admit_after` rounds submit `later` while `first` still decodes.
    Returns the results in the order they finished."""
    reqs = {r.slot: r for r in [*first, *later]}
    eng.submit(first)
    order, rounds = [], 0
    while eng.busy:
        if rounds == admit_after:
            assert all(r.slot in eng._active for r in first), "long turn ended too soon"
            eng.submit(later)
        for res in eng.step():
            tracker.record(reqs[res.slot], res)
            order.append(res)
        rounds += 1
    return order


def test_turn_admitted_while_a_long_turn_decodes_finishes_first(params):
    eng = make_engine(params)
    tr = Tracker(eng)
    a, b = eng.allocate(), eng.allocate()
    tr.new(a)
    tr.new(b)
    long_turn = TurnRequest(a, _prompt(40, 9), 60, GREEDY)
    short = TurnRequest(b, _prompt(41, 5), 6, SamplingParams(temperature=0.9, seed=7))
    before = eng.stats.snapshot()
    order = _serve(eng, tr, [long_turn], [short], admit_after=3)
    assert [r.slot for r in order] == [b, a]  # the short turn finished first
    assert [len(r.tokens) for r in order] == [6, 60]
    # It joined the running generation: fewer decode dispatches than running them in turn.
    alone_dispatches = -(-60 // 4) + -(-6 // 4)
    assert eng.stats.decode_dispatches - before.decode_dispatches < alone_dispatches
    tr.check(params, [a, b])

    # Equal to each turn run alone on a fresh engine.
    for req, res in [(short, order[0]), (long_turn, order[1])]:
        solo = make_engine(params)
        s = solo.allocate()
        [ref] = solo.generate([TurnRequest(s, req.new_tokens, req.max_new_tokens,
                                           req.sampling)])
        np.testing.assert_array_equal(res.tokens, ref.tokens)
        np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(res.routing, ref.routing)
        assert res.stop_reason == ref.stop_reason == StopReason.LENGTH


def test_released_slot_reused_while_others_decode(params):
    """Turns of different lengths come and go while a long one decodes; a released slot's
    pages go back to the pool and are handed to the next turn with their stale contents."""
    eng = make_engine(params)
    tr = Tracker(eng)
    a, b, c = eng.allocate(), eng.allocate(), eng.allocate()
    for s in (a, b, c):
        tr.new(s)
    reqs = {a: TurnRequest(a, _prompt(50, 20), 50, GREEDY),
            b: TurnRequest(b, _prompt(51, 13), 5, GREEDY),
            c: TurnRequest(c, _prompt(52, 3), 9, GREEDY)}
    eng.submit([reqs[a], reqs[b]])
    rounds, finished, d = 0, [], None
    while eng.busy:
        if rounds == 2:
            assert a in eng._active
            eng.submit([reqs[c]])
        for res in eng.step():
            tr.record(reqs[res.slot], res)
            finished.append(res.slot)
            if res.slot == b and d is None:  # b is done: release it, start d in its place
                held = eng.kv_pages[0]
                eng.release(b)
                assert eng.kv_pages[0] < held
                d = eng.allocate()
                assert d == b
                tr.new(d)
                reqs[d] = TurnRequest(d, _prompt(53, 17), 7, GREEDY)
                eng.submit([reqs[d]])
        rounds += 1
    assert finished[-1] == a and len(finished) == 4
    tr.check(params, [a, c, d])


def test_kv_memory_tracks_tokens_held(params):
    """Pages held = the pages the contexts need, not slots x the longest context."""
    eng = make_engine(params, num_slots=19)  # 16 contexts, room for 3 forks
    slots = [eng.allocate() for _ in range(16)]
    lengths = [120] + [5] * 15
    eng.generate([TurnRequest(s, _prompt(60 + i, n), 0, GREEDY)
                  for i, (s, n) in enumerate(zip(slots, lengths))])
    need = sum(-(-n // PAGE) for n in lengths)  # 15 + 15 pages
    held, pool = eng.kv_pages
    assert held == need
    assert pool * PAGE <= 2 * (sum(lengths) + len(lengths) * PAGE)  # a power of two above
    assert pool * PAGE <= len(slots) * 128 // 4  # contiguous: 16 slots x 128 positions
    # Forks share full pages: the 120-token context (15 full pages) costs no new page.
    forks = eng.fork(slots[0], 3)
    assert eng.kv_pages[0] == need
    # Releasing frees the pages nobody else holds.
    eng.release(slots[1])
    assert eng.kv_pages[0] == need - 1
    eng.release(slots[0])
    assert eng.kv_pages[0] == need - 1  # the forks still hold its pages
    for f in forks:
        eng.release(f)
    assert eng.kv_pages[0] == need - 1 - 15


def test_slot_state_is_sharded_never_replicated(params):
    """On the 8-device mesh the engine's big state is split over every device: Mamba state by
    slots over data and heads over tensor x expert, the KV pool by pages over all 8. Only the
    small per-slot leaves (lengths, flags, the last hidden state, the B/C conv tails: under
    0.4% of a Super slot's 170 MB) are split over the row axis (data) alone."""
    mesh = make_mesh({"data": 2, "expert": 2, "tensor": 2})
    eng = make_engine(jax.device_put(params, param_shardings(CFG, mesh, DECODE_RULES)),
                      num_slots=8, mesh=mesh)
    s = eng.allocate()
    eng.generate([TurnRequest(s, _prompt(70, 5), 3, GREEDY)])
    small = {"lengths", "hidden", "live", "remaining", "conv_B", "conv_C"}
    for path, leaf in jax.tree_util.tree_leaves_with_path(eng._state):
        name = jax.tree_util.keystr(path)
        shard = leaf.addressable_shards[0].data
        split = 2 if any(f".{k}" in name for k in small) else 8
        assert shard.size * split <= leaf.size, (name, leaf.sharding.spec)
    ssm = eng._state.cache.blocks[0]["0_mamba"].ssm
    assert tuple(ssm.sharding.spec)[:3] == (None, "data", ("tensor", "expert"))
    pool = eng._state.cache.blocks[1]["0_attention"].k
    assert tuple(pool.sharding.spec) == (None, ("data", "expert", "tensor"))


def test_decode_step_lowers_from_abstract_inputs():
    """The AOT entry point: the decode step lowers from shapes alone (bf16 decode view, sharded
    slot state), as experiments/scale/aot.py does for the pod config."""
    from avalon.inference import device as dev
    from avalon.inference.weights import abstract_decode_view
    mesh = make_mesh({"data": 2, "expert": 2, "tensor": 2})
    setup = dev.Setup(cfg=CFG, mesh=mesh, max_context=WINDOW, steps=4, page_size=PAGE)
    args = dev.abstract_decode_inputs(setup, slots=16, num_pages=64, rows=8, width=8)
    lowered = dev.decode.lower(abstract_decode_view(CFG, mesh), *args, setup=setup)
    assert lowered.out_info[0].cache.blocks[0]["0_mamba"].ssm.shape[1] == 16
    ssm = args[0].cache.blocks[0]["0_mamba"].ssm
    assert tuple(ssm.sharding.spec)[:3] == (None, "data", ("tensor", "expert"))
