"""The engine's shape buckets are a short fixed ladder per config, so the programs a serving
run compiles are bounded whatever the workload (each XLA:CPU program holds ~500 memory maps
of JIT code; with doubling ladders a long toy run compiled hundreds and neared the kernel's
map limit, RESULTS.md)."""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.inference import device as dev
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.inference.pages import bucket, chunk_take, ladder
from tests.inference.test_engine import CFG

WINDOW = 256
PAGE = 8
SLOTS = 16


def test_ladders():
    assert ladder(1, 16, 4) == (1, 4, 16)
    assert ladder(8, 128, 2) == (8, 16, 32, 64, 128)
    assert ladder(8, 100, 4) == (8, 32, 100)
    assert ladder(8, 4, 2) == (4,)
    assert [bucket(n, (1, 4, 16)) for n in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    with pytest.raises(ValueError, match="17 exceeds the largest bucket 16"):
        bucket(17, (1, 4, 16))


def _plan_work(need, sizes, cost):
    """Padded work of feeding `need` tokens by repeated chunk_take: the rungs' padded tokens
    plus `cost` for every dispatch after the first; also the chunks fed."""
    work, fed = -cost, []
    while need:
        take = chunk_take(need, sizes, cost)
        assert take == need or (take in sizes and take < need), (need, take)
        work += bucket(take, sizes) + cost
        fed.append(take)
        need -= take
    return work, fed


def _cheapest_work(need, sizes, cost):
    """Bottom-up over every amount <= need: the least padded work of any sequence of chunks
    (each padded to its rung), the reference chunk_take's plans must reach."""
    best = [0] * (need + 1)
    for m in range(1, need + 1):
        best[m] = min(bucket(c, sizes) + (cost if c < m else 0) + best[m - c]
                      for c in range(1, m + 1))
    return best[need]


@pytest.mark.parametrize("cost", [0, 6, 48])
def test_chunk_take_pads_least(cost):
    sizes = ladder(8, 256, 4)
    for need in range(1, 257):
        work, fed = _plan_work(need, sizes, cost)
        assert work <= bucket(need, sizes)  # never worse than one padded dispatch
        assert work == _cheapest_work(need, sizes, cost), (need, fed)


def test_chunk_take_examples():
    sizes = ladder(8, 256, 4)
    assert _plan_work(64, sizes, 6)[1] == [32, 32]  # not one dispatch padded to 128
    assert _plan_work(64, sizes, 48)[1] == [32, 32]
    assert _plan_work(100, sizes, 48)[1] == [100]  # padding 28 beats three more dispatches
    assert _plan_work(20, sizes, 48)[1] == [20]
    assert _plan_work(256, sizes, 6)[1] == [256]
    with pytest.raises(ValueError, match="need=300"):
        chunk_take(300, sizes, 6)


def test_engine_splits_a_prompt_that_would_pad_to_twice_its_length():
    """A 64-token prompt on the (8, 32, 128) chunk ladder prefills as two 32-token dispatches,
    and generates what an engine whose ladder holds 64 (one dispatch) generates."""
    params = M.init_params(jax.random.key(0), M.presets.get("tiny"))
    prompt = np.random.default_rng(1).integers(0, CFG.vocab_size, 64).astype(np.int32)
    out = {}
    for chunk in (128, 64):
        eng = Engine(CFG, params, num_slots=8, max_context=96, steps_per_dispatch=4,
                     prefill_chunk=chunk, page_size=PAGE)
        s = eng.allocate()
        (res,) = eng.generate([TurnRequest(s, prompt, 6, SamplingParams(greedy=True))])
        out[chunk] = (eng.stats.prefill_dispatches, list(res.tokens), np.asarray(res.logprobs))
    assert out[128][0] == 2 and out[64][0] == 1
    assert out[128][1] == out[64][1]
    np.testing.assert_allclose(out[128][2], out[64][2], atol=1e-5)


@pytest.mark.slow  # ~30 compiles of the tiny model on one loaded core
def test_programs_compiled_over_a_varied_workload_stay_within_the_ladders():
    """27 generate calls over 1-16 turns with prompts of 1-200 tokens, replies of 1-40 and
    contexts up to the 256-token window (every row count, chunk and width a doubling ladder
    has): prefill programs <= rows x chunk x width rungs (3 x 3 x 4 = 36 here; doubling
    ladders have 5 x 4 x 6 = 120), decode programs <= rows x width rungs (2 x 4 = 8)."""
    params = M.init_params(jax.random.key(0), M.presets.get("tiny"))
    dev.release_programs()
    eng = Engine(CFG, params, num_slots=SLOTS, max_context=WINDOW, steps_per_dispatch=4,
                 prefill_chunk=64, page_size=PAGE, kv_pages=SLOTS * WINDOW // PAGE)
    b = eng.buckets
    assert b["prefill_rows"] == (1, 4, 16) and b["chunk"] == (8, 32, 64)
    assert b["width"] == (1, 4, 16, 32) and b["decode_rows"] == (8, 16)
    rng = np.random.default_rng(0)
    rows, chunks, widths = set(), set(), set()
    for call in range(27):
        n = (1, 2, 3, 5, 8, 11, 16, 4, 7)[call % 9]
        slots = [eng.allocate() for _ in range(n)]
        reqs = []
        for s in slots:
            prompt = int(rng.integers(1, 200))
            reply = int(rng.integers(1, 40))
            reqs.append(TurnRequest(s, rng.integers(0, CFG.vocab_size, prompt).astype(np.int32),
                                    min(reply, WINDOW - prompt), SamplingParams(greedy=True)))
            chunks.add(min(prompt, 64))
            widths.add(-(-(prompt + reply) // PAGE))
        rows.add(n)
        eng.generate(reqs)
        for s in slots:
            eng.release(s)
    # The workload spans what a doubling ladder would have compiled separately.
    assert len({1 << (r - 1).bit_length() for r in rows}) >= 5
    assert len({max(8, 1 << (c - 1).bit_length()) for c in chunks}) >= 4
    assert len({1 << (w - 1).bit_length() for w in widths}) >= 5
    assert eng.kv_pages[1] == SLOTS * WINDOW // PAGE  # one pool size throughout
    n_prefill = len(b["prefill_rows"]) * len(b["chunk"]) * len(b["width"])
    assert dev.prefill._cache_size() <= n_prefill
    assert dev.decode._cache_size() <= len(b["decode_rows"]) * len(b["width"])
