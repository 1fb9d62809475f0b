"""The KV pool's size and the programs it compiles.

The pool's page count is in every prefill and decode program's shapes, so a pool that grows
compiles its buckets again at each size. A run that knows its need starts there
(`Engine(kv_pages=...)`); a pool that does grow drops the programs of its old size, which no
later dispatch of the engine can use (left cached, a long CPU run's JIT code reached the
kernel's memory-map limit).
"""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference import device as dev
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import MIN_PAGES, Engine
from tests.inference.test_engine import CFG

WINDOW = 64
PAGE = 8
SLOTS = 8
GREEDY = SamplingParams(greedy=True)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), M.presets.get("tiny"))


def _engine(params, **kw):
    return Engine(CFG, params, num_slots=SLOTS, max_context=WINDOW, steps_per_dispatch=4,
                  prefill_chunk=32, page_size=PAGE, **kw)


def _turns(eng, prompt_len, out_len):
    slots = [eng.allocate() for _ in range(SLOTS)]
    reqs = [TurnRequest(s, (np.arange(prompt_len) * (s + 3) % CFG.vocab_size).astype(np.int32),
                        out_len, GREEDY) for s in slots]
    return slots, eng.generate(reqs)


def test_presized_pool_never_grows_and_samples_as_a_grown_one(params):
    full = SLOTS * WINDOW // PAGE
    grown, presized = _engine(params), _engine(params, kv_pages=full)
    assert grown.kv_pages == (0, MIN_PAGES) and presized.kv_pages == (0, full)
    # 8 slots x (13 + 20 tokens = 5 pages) = 40 pages: the default pool of 16 must grow.
    _, a = _turns(grown, 13, 20)
    _, b = _turns(presized, 13, 20)
    assert grown.kv_pages[1] > MIN_PAGES
    assert presized.kv_pages == (40, full)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-6, atol=1e-6)


def test_growth_drops_the_programs_of_the_old_pool(params):
    eng = _engine(params)
    slots, _ = _turns(eng, 5, 3)  # 8 slots x 1 page: the 16-page pool holds them
    assert eng.kv_pages[1] == MIN_PAGES
    assert dev.prefill._cache_size() >= 1 and dev.decode._cache_size() >= 1
    for s in slots:
        eng.release(s)
    # 8 slots x 3 pages (17 + 3 tokens) = 24: the pool grows to 32 before the one prefill
    # dispatch (one chunk of 17 tokens).
    _turns(eng, 17, 3)
    assert eng.kv_pages[1] == 2 * MIN_PAGES
    # Only programs for the new pool remain: the one prefill bucket and the one decode bucket
    # (3 pages a row) used after the growth.
    assert dev.prefill._cache_size() == 1
    assert dev.decode._cache_size() == 1


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_kv_pages_is_one_line(params, bad):
    with pytest.raises(ValueError, match=rf"Engine: kv_pages={bad!r} must be a positive int"):
        _engine(params, kv_pages=bad)

