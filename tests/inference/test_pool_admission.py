"""A KV pool with a ceiling (`Engine(max_kv_pages=...)`): admission waits, the pool never grows.

A turn starts only when its worst case (context + new tokens + max_new_tokens) fits beside the
running turns'; until then it waits, and it runs with the room there is once nothing else runs.
Before the ceiling the engine grew the pool whenever a dispatch ran short (on the pod, past
HBM). Results are checked against the same turn on an engine with a pool large enough.
"""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams, StopReason, TurnRequest
from avalon.inference.engine import Engine
from tests.inference.test_engine import CFG, _prompt

WINDOW = 128
PAGE = 8
CAP = 16  # pages: 128 positions
GREEDY = SamplingParams(greedy=True)


def _engine(params, **kw):
    return Engine(CFG, params, num_slots=4, max_context=WINDOW, steps_per_dispatch=4,
                  prefill_chunk=16, page_size=PAGE, **kw)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), M.presets.get("tiny"))


def _alone(params, req):
    eng = _engine(params, kv_pages=64)
    s = eng.allocate()
    [res] = eng.generate([TurnRequest(s, req.new_tokens, req.max_new_tokens, req.sampling)])
    return res


def _same(res, ref, n=None):
    n = len(ref.tokens) if n is None else n
    np.testing.assert_array_equal(res.tokens, ref.tokens[:n])
    np.testing.assert_allclose(res.logprobs, ref.logprobs[:n], atol=1e-5, rtol=0)


def test_a_turn_waits_for_pages_and_the_pool_never_grows(params):
    eng = _engine(params, kv_pages=CAP, max_kv_pages=CAP)
    a, b = eng.allocate(), eng.allocate()
    ra = TurnRequest(a, _prompt(70, 40), 40, GREEDY)  # 80 tokens: 10 pages
    rb = TurnRequest(b, _prompt(71, 30), 30, SamplingParams(temperature=0.8, seed=3))  # 8
    eng.submit([ra, rb])
    assert eng.stats.turns_deferred == 1
    got, released = {}, False
    while eng.busy:
        for res in eng.step():
            got[res.slot] = res
            if res.slot == a:  # a holds its 10 pages idle: b still cannot start
                assert b not in got
                assert eng.kv_pages[0] == 10
                eng.release(a)
                released = True
        assert eng.kv_pages[1] == CAP
        if not released:
            assert eng.kv_pages[0] <= 10  # b has not taken a page
    assert eng.kv_pages == (8, CAP)
    _same(got[a], _alone(params, ra))
    _same(got[b], _alone(params, rb))
    assert got[b].stop_reason == StopReason.LENGTH and eng.stats.turns_cut_by_pool == 0


def test_with_nothing_running_a_turn_takes_the_room_there_is(params):
    eng = _engine(params, kv_pages=CAP, max_kv_pages=CAP)
    a, b, c = eng.allocate(), eng.allocate(), eng.allocate()
    ra = TurnRequest(a, _prompt(72, 40), 37, GREEDY)  # 77 tokens: 10 pages, then idle
    rb = TurnRequest(b, _prompt(73, 30), 30, GREEDY)  # wants 8 pages; 6 are left: 48 tokens
    rc = TurnRequest(c, _prompt(74, 20), 4, GREEDY)  # nothing left for its 20 new tokens
    res_a, res_b, res_c = eng.generate([ra, rb, rc])
    assert eng.kv_pages == (CAP, CAP)
    _same(res_a, _alone(params, ra))
    _same(res_b, _alone(params, rb), n=18)  # 30 + 18 = 48 positions
    assert res_b.stop_reason == StopReason.CONTEXT_FULL and res_b.context_length == 48
    assert res_c.stop_reason == StopReason.POOL_FULL and res_c.n_in_new == 0
    assert len(res_c.tokens) == 0 and eng.context_length(c) == 0
    assert eng.stats.turns_cut_by_pool == 1
    # A fork needs a free page for a copy of the partial last page: refused, not grown.
    with pytest.raises(ValueError, match=r"fork: slot 0 into k=1 needs 1 free KV pages and "
                                         r"the pool is at max_kv_pages=16"):
        eng.fork(a, 1)
    eng.release(b)
    [fork] = eng.fork(a, 1)
    assert eng.kv_pages == (11, CAP) and eng.context_length(fork) == 77


@pytest.mark.parametrize("kw, match", [
    (dict(max_kv_pages=0), r"Engine: max_kv_pages=0 must be a positive int"),
    (dict(kv_pages=32, max_kv_pages=16), r"Engine: kv_pages=32 exceeds max_kv_pages=16"),
])
def test_bad_max_kv_pages_is_one_line(params, kw, match):
    with pytest.raises(ValueError, match=match):
        _engine(params, **kw)


def test_a_suspended_engine_frees_its_device_state_and_comes_back_empty(params):
    """Between rollouts the trainer's update runs where the engine's params view and slot
    state were (`Engine.suspend`); after `set_params` the engine samples as a fresh one."""
    eng = _engine(params, kv_pages=CAP, max_kv_pages=CAP)
    a = eng.allocate()
    req = TurnRequest(a, _prompt(75, 30), 12, GREEDY)
    eng.generate([req])
    with pytest.raises(RuntimeError, match="release every slot first"):
        eng.suspend()
    eng.release(a)
    eng.suspend()
    assert eng.suspended and eng._params is None and eng._run_params is None
    eng.set_params(params)
    assert not eng.suspended and eng.kv_pages == (0, CAP)  # none held, the pool as it was
    b = eng.allocate()
    [res] = eng.generate([TurnRequest(b, req.new_tokens, req.max_new_tokens, GREEDY)])
    _same(res, _alone(params, req))
    assert eng.context_length(b) == 30 + len(res.tokens)
