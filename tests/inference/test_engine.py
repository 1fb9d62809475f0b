"""The engine against full forwards of the whole context.

Reference. For every slot the test keeps the context it expects (all new_tokens and sampled
tokens in order) and runs one full forward (no cache) over it. Because the model is causal,
"greedy generation == naive generation by repeated full forwards" is exactly: every greedily
sampled token is the argmax of the full forward's logits at the position before it. The same
forward gives the reference log-probs (log-softmax of logits / T), the reference routing at
every position, and, run with the engine's routing replayed, its logits again.

Config. The tiny preset with `time_step_min=0`: HF's Mamba-2 (and so our model) clamps dt
below at time_step_min on the chunked path but not in the one-token decode step, a ~3e-5
difference on tiny's random weights that belongs to the model, not to the engine. Without the
clamp both paths compute the same function and the comparison isolates the engine's
bookkeeping (cache positions, masking, slot moves, sampling) at 1e-5.

Compile budget: two engines share every compiled program (same static setup, 8-row working
state), contexts stay within two KV buckets (16, 32), prefill chunks are one bucket (8).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import backends
from avalon import model as M
from avalon.backends import DecodeBackend, cpu_gemm
from avalon.backends.cpu_out_in import OutIn
from avalon.inference.api import SamplingParams, StopReason, TurnRequest
from avalon.inference.engine import Engine
from avalon.model import param_shardings
from avalon.model.config import MoeBackend
from avalon.model.dense import BackendWeight
from avalon.sharding import DECODE_RULES, make_mesh

CFG = M.presets.get("tiny", time_step_min=0.0)
WINDOW = 32
REF_ROWS = 8
GREEDY = SamplingParams(greedy=True)


def detokenize(tokens):
    return "".join(chr(ord("a") + t % 26) for t in tokens)


def make_engine(params, num_slots, mesh=None):
    return Engine(CFG, params, num_slots=num_slots, max_context=WINDOW, mesh=mesh,
                  steps_per_dispatch=4, prefill_chunk=8, detokenize=detokenize)


@pytest.fixture(scope="module")
def params():
    return M.init_params(jax.random.key(0), M.presets.get("tiny"))


@pytest.fixture(scope="module")
def engines(params):
    # 16 slots: calls with <= 8 turns gather their rows; 8 slots: the whole state is the rows.
    return {"gathered": make_engine(params, 16), "whole": make_engine(params, 8)}


@functools.partial(jax.jit, static_argnames=("replay", "cfg"))
def _reference(params, tokens, routing, replay, cfg=CFG):
    r = M.forward(params, tokens, cfg, routing=routing if replay else None)
    return jax.nn.log_softmax(r.logits, axis=-1), r.logits, r.routing


class Tracker:
    """What the engine's slots should hold, and every sampled token with its log-prob."""

    def __init__(self, engine, cfg=CFG):
        self.engine, self.cfg = engine, cfg
        self.context, self.routing, self.samples = {}, {}, {}

    def new(self, slot):
        self.context[slot], self.routing[slot], self.samples[slot] = [], [], []

    def fork(self, src, k):
        slots = self.engine.fork(src, k)
        for s in slots:
            self.context[s] = list(self.context[src])
            self.routing[s] = list(self.routing[src])
            self.samples[s] = list(self.samples[src])
        return slots

    def generate(self, requests):
        results = self.engine.generate(requests)
        for req, res in zip(requests, results):
            self.record(req, res)
        return results

    def record(self, req, res):
        """Take one finished turn into the expected contexts."""
        assert res.slot == req.slot
        if res.n_in_new:
            self.context[req.slot] += [int(t) for t in req.new_tokens]
        t = None if req.sampling.greedy else req.sampling.temperature
        for tok, lp in zip(res.tokens, res.logprobs):
            self.samples[req.slot].append((len(self.context[req.slot]), int(tok), float(lp),
                                           t))
            self.context[req.slot].append(int(tok))
        self.routing[req.slot] += list(res.routing)
        assert len(res.routing) == res.n_in_new + len(res.tokens)
        assert res.context_length == len(self.context[req.slot])

    def check(self, params, slots):
        """Every listed slot against one full forward of its context (see module docstring)."""
        slots = list(slots)
        assert len(slots) <= REF_ROWS
        window = self.engine.max_context
        tokens = np.zeros((REF_ROWS, window), np.int32)
        routing = np.zeros((CFG.count("E"), REF_ROWS, window, CFG.num_experts_per_tok),
                           np.int32)
        for b, s in enumerate(slots):
            ctx = self.context[s]
            assert self.engine.context_length(s) == len(ctx)
            tokens[b, :len(ctx)] = ctx
            routing[:, b, :len(ctx)] = np.asarray(self.routing[s]).transpose(1, 0, 2)
        logp, logits, ref_routing = jax.device_get(_reference(params, tokens, routing, False,
                                                              self.cfg))
        replay_logp = np.asarray(_reference(params, tokens, routing, True, self.cfg)[0])
        for b, s in enumerate(slots):
            n = len(self.context[s])
            np.testing.assert_array_equal(ref_routing[:, b, :n], routing[:, b, :n],
                                          err_msg=f"slot {s}: routing differs")
            for pos, tok, lp, temp in self.samples[s]:
                prev = logits[b, pos - 1]
                if temp is None:
                    assert tok == int(np.argmax(prev)), f"slot {s} pos {pos}: not greedy"
                    ref = logp[b, pos - 1, tok]
                else:
                    ref = np.asarray(jax.nn.log_softmax(prev / temp))[tok]
                np.testing.assert_allclose(lp, ref, atol=1e-5, err_msg=f"slot {s} pos {pos}")
                if temp is None:
                    np.testing.assert_allclose(lp, replay_logp[b, pos - 1, tok], atol=1e-5)
            # Replaying the engine's experts reproduces the engine's logits everywhere.
            np.testing.assert_allclose(replay_logp[b, :n], logp[b, :n], atol=1e-5)


def _prompt(seed, n):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, n).astype(np.int32)


@pytest.mark.parametrize("kind", ["gathered", "whole"])
def test_staggered_turns_equal_full_forwards(engines, params, kind):
    eng = engines[kind]
    tr = Tracker(eng)
    a, b, c = eng.allocate(), eng.allocate(), eng.allocate()
    for s in (a, b, c):
        tr.new(s)
    before = eng.stats.snapshot()
    res = tr.generate([TurnRequest(a, _prompt(1, 5), 6, GREEDY),
                       TurnRequest(b, _prompt(2, 11), 3, GREEDY)])
    assert [r.stop_reason for r in res] == [StopReason.LENGTH] * 2
    assert [len(r.tokens) for r in res] == [6, 3]
    # One batched prefill per chunk of 8 (11 tokens -> 2), one decode per 4 tokens (6 -> 2).
    assert eng.stats.prefill_dispatches - before.prefill_dispatches == 2
    assert eng.stats.decode_dispatches - before.decode_dispatches == 2

    sampled = SamplingParams(temperature=0.8, top_k=5, seed=3)
    tr.generate([TurnRequest(a, _prompt(3, 3), 5, GREEDY), TurnRequest(c, _prompt(4, 2), 7,
                                                                       sampled)])
    eng.release(b)
    d = eng.allocate()  # reuses b's slot: must start empty
    tr.new(d)
    res = tr.generate([TurnRequest(d, _prompt(5, 4), 2, GREEDY),
                       TurnRequest(a, np.zeros(0, np.int32), 4, GREEDY),  # from stored state
                       TurnRequest(c, _prompt(6, 1), 0, sampled)])  # prefill only
    assert res[2].stop_reason == StopReason.LENGTH and len(res[2].tokens) == 0
    assert eng.context_length(a) == 5 + 6 + 3 + 5 + 4
    # Slots left out of a call keep their state: a and c sit out one, then continue.
    tr.generate([TurnRequest(d, _prompt(7, 2), 3, GREEDY)])
    tr.generate([TurnRequest(a, _prompt(8, 1), 2, GREEDY), TurnRequest(c, _prompt(9, 1), 3,
                                                                     GREEDY)])
    tr.check(params, [a, c, d])
    for s in (a, c, d):
        eng.release(s)


def test_fork_continues_identically_without_prefill(engines, params):
    eng = engines["gathered"]
    tr = Tracker(eng)
    s = eng.allocate()
    tr.new(s)
    tr.generate([TurnRequest(s, _prompt(7, 6), 2, GREEDY)])
    before = eng.stats.snapshot()
    forks = tr.fork(s, 3)
    assert eng.stats.prefill_dispatches == before.prefill_dispatches
    assert eng.stats.decode_dispatches == before.decode_dispatches
    assert all(eng.context_length(f) == eng.context_length(s) for f in forks)

    res = tr.generate([TurnRequest(x, np.array([7, 9], np.int32), 5, GREEDY)
                       for x in [s, *forks]])
    for r in res[1:]:
        np.testing.assert_array_equal(r.tokens, res[0].tokens)
        np.testing.assert_array_equal(r.logprobs, res[0].logprobs)
        np.testing.assert_array_equal(r.routing, res[0].routing)

    # A sampled turn depends on (seed, context) only, not on the batch it runs in.
    hot = SamplingParams(temperature=1.3, seed=11)
    alone = tr.generate([TurnRequest(forks[0], np.zeros(0, np.int32), 6, hot)])[0]
    crowd = tr.generate([TurnRequest(forks[2], _prompt(8, 3), 2, GREEDY),
                         TurnRequest(forks[1], np.zeros(0, np.int32), 6, hot)])[1]
    np.testing.assert_array_equal(alone.tokens, crowd.tokens)
    tr.check(params, [s, *forks])
    for x in [s, *forks]:
        eng.release(x)


def test_stop_tokens_and_strings(engines, params):
    eng = engines["gathered"]
    tr = Tracker(eng)
    s = eng.allocate()
    tr.new(s)
    tr.generate([TurnRequest(s, _prompt(9, 4), 0, GREEDY)])
    f1, f2, f3 = tr.fork(s, 3)
    g = tr.generate([TurnRequest(f1, np.zeros(0, np.int32), 10, GREEDY)])[0].tokens
    text = detokenize(g)
    stop_at = list(g).index(g[6])  # first occurrence of that token
    pattern = text[1:3]
    cut = text.find(pattern) + len(pattern) - 1  # the token that completes the string
    before = eng.stats.snapshot()
    r2, r3 = tr.generate([
        TurnRequest(f2, np.zeros(0, np.int32), 10, GREEDY, stop_tokens=(int(g[6]),)),
        TurnRequest(f3, np.zeros(0, np.int32), 10, GREEDY, stop_strings=("zzzz", pattern))])
    assert r2.stop_reason == StopReason.STOP
    np.testing.assert_array_equal(r2.tokens, g[:stop_at + 1])
    assert r3.stop_reason == StopReason.STOP
    np.testing.assert_array_equal(r3.tokens, g[:cut + 1])
    assert eng.context_length(f3) == 4 + cut + 1
    # The cut came inside a 4-token dispatch: the kept tokens were re-absorbed in a prefill.
    assert eng.stats.prefill_dispatches > before.prefill_dispatches
    # The state after the cut is right: the next turn matches full forwards.
    tr.generate([TurnRequest(f3, _prompt(10, 3), 4, GREEDY),
                 TurnRequest(f2, _prompt(11, 2), 3, GREEDY)])
    tr.check(params, [f1, f2, f3])
    for x in (s, f1, f2, f3):
        eng.release(x)


def test_context_full(engines, params):
    eng = engines["gathered"]
    tr = Tracker(eng)
    s, t = eng.allocate(), eng.allocate()
    tr.new(s)
    tr.new(t)
    res = tr.generate([TurnRequest(s, _prompt(12, 30), 0, GREEDY),
                       TurnRequest(t, _prompt(13, WINDOW), 3, GREEDY)])
    assert res[0].stop_reason == StopReason.LENGTH
    assert res[1].stop_reason == StopReason.CONTEXT_FULL and len(res[1].tokens) == 0
    assert eng.context_length(t) == WINDOW
    # New tokens that do not fit end the turn at once, absorbing nothing.
    over = tr.generate([TurnRequest(s, _prompt(14, 3), 5, GREEDY)])[0]
    assert over.stop_reason == StopReason.CONTEXT_FULL
    assert over.n_in_new == 0 and len(over.tokens) == 0 and eng.context_length(s) == 30
    # Decoding stops when the window is full.
    full = tr.generate([TurnRequest(s, np.zeros(0, np.int32), 10, GREEDY)])[0]
    assert full.stop_reason == StopReason.CONTEXT_FULL and len(full.tokens) == 2
    assert eng.context_length(s) == WINDOW
    again = tr.generate([TurnRequest(s, np.zeros(0, np.int32), 1, GREEDY)])[0]
    assert again.stop_reason == StopReason.CONTEXT_FULL and len(again.tokens) == 0
    tr.check(params, [s, t])
    eng.release(s)
    eng.release(t)


def test_dispatches_do_not_grow_with_requests(engines, params):
    eng = engines["whole"]  # 8 slots: every slot is a row
    tr = Tracker(eng)
    slots = [eng.allocate() for _ in range(8)]
    for s in slots:
        tr.new(s)
    n_in = [3, 12, 1, 7, 9, 2, 5, 4]
    max_new = [1, 4, 6, 2, 3, 5, 7, 2]
    before = eng.stats.snapshot()
    res = tr.generate([TurnRequest(s, _prompt(20 + i, n), m, GREEDY)
                       for i, (s, n, m) in enumerate(zip(slots, n_in, max_new))])
    assert [len(r.tokens) for r in res] == max_new
    assert eng.stats.prefill_dispatches - before.prefill_dispatches == 2  # ceil(12 / 8)
    assert eng.stats.decode_dispatches - before.decode_dispatches == 2  # ceil(7 / 4)
    tr.check(params, slots)
    for s in slots:
        eng.release(s)


def test_a_prompt_arriving_mid_decode_does_not_hold_the_sampling_rows(engines, params):
    eng = engines["whole"]
    tr = Tracker(eng)
    a, b = eng.allocate(), eng.allocate()
    tr.new(a)
    tr.new(b)
    req_a = TurnRequest(a, _prompt(40, 3), 24, GREEDY)
    req_b = TurnRequest(b, _prompt(41, 20), 2, GREEDY)  # three chunks of 8
    eng.submit([req_a])
    done = {}
    decodes = eng.stats.decode_dispatches
    while eng.stats.decode_dispatches == decodes:
        done.update({r.slot: r for r in eng.step()})
    eng.submit([req_b])
    kinds = []
    while len(done) < 2:
        p, d = eng.stats.prefill_dispatches, eng.stats.decode_dispatches
        done.update({r.slot: r for r in eng.step()})
        kinds += ["p"] * (eng.stats.prefill_dispatches - p) + \
            ["d"] * (eng.stats.decode_dispatches - d)
    # a samples between b's chunks: no two prefills back to back while it still could.
    order = "".join(kinds)
    assert order.count("p") == 3 and "pp" not in order, order
    tr.record(req_a, done[a])
    tr.record(req_b, done[b])
    tr.check(params, [a, b])
    eng.release(a)
    eng.release(b)


def test_set_params_swaps_the_arrays_the_engine_reads(engines, params):
    eng = engines["whole"]
    other = jax.tree.map(lambda x: x * 1.5, params)
    eng.set_params(other)
    try:
        assert eng._params is other  # the caller's arrays, not a copy
        tr = Tracker(eng)
        s = eng.allocate()
        tr.new(s)
        tr.generate([TurnRequest(s, _prompt(30, 6), 4, GREEDY)])
        tr.check(other, [s])
        eng.release(s)
    finally:
        eng.set_params(params)


@pytest.mark.parametrize("shape,slot_axes,head_axes,page_axes", [
    ({"data": 2, "tensor": 4}, "data", "tensor", ("data", "tensor")),
    ({"data": 2, "expert": 2, "tensor": 2}, "data", ("tensor", "expert"),
     ("data", "expert", "tensor"))])
def test_sharded_engine_equals_unsharded(engines, params, shape, slot_axes, head_axes,
                                         page_axes):
    """DECODE_RULES: the dense layers tensor-parallel over tensor x expert (rows over data),
    routed experts over expert, the KV pool split by pages over every device (each attends
    over its own pages, the partial softmaxes merged): the same tokens as one device."""
    mesh = make_mesh(shape)
    sharded_params = jax.device_put(params, param_shardings(CFG, mesh, DECODE_RULES))
    sharded = make_engine(sharded_params, 8, mesh=mesh)
    plain = engines["whole"]
    outs = []
    for eng in (sharded, plain):
        a, b = eng.allocate(), eng.allocate()
        outs.append(eng.generate([
            TurnRequest(a, _prompt(15, 7), 5, GREEDY),
            TurnRequest(b, _prompt(16, 3), 6, SamplingParams(temperature=0.9, seed=4))]))
        eng.release(a)
        eng.release(b)
    for x, y in zip(*outs):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
        np.testing.assert_array_equal(x.routing, y.routing)
        assert x.stop_reason == y.stop_reason and x.context_length == y.context_length
    # Slots over data, Mamba heads over tensor (x expert): [repeats, slots, heads, P, N];
    # pool pages over every device: [repeats, pages, kv_heads, page_size, head_dim].
    ssm = sharded._state.cache.blocks[0]["0_mamba"].ssm
    assert tuple(ssm.sharding.spec)[:3] == (None, slot_axes, head_axes)
    pool = sharded._state.cache.blocks[1]["0_attention"].k
    assert tuple(pool.sharding.spec) == (None, page_axes)


@pytest.mark.parametrize("field,request_kw,match", [
    ("slot", dict(slot=99), "slot=99.*not an allocated slot"),
    ("max_new_tokens", dict(max_new_tokens=-1), "max_new_tokens=-1"),
    ("new_tokens", dict(new_tokens=np.array([1.5, 2.0])), "new_tokens.*integers"),
    ("new_tokens", dict(new_tokens=np.array([[1, 2]])), "new_tokens.*1-D"),
    ("new_tokens", dict(new_tokens=np.array([1, 128])), "token id 128 is outside"),
    ("new_tokens", dict(new_tokens=np.zeros(0, np.int32)), "context is empty"),
    ("new_tokens", dict(new_tokens=np.zeros(0, np.int32), max_new_tokens=0), "does nothing"),
    ("temperature", dict(sampling=SamplingParams(temperature=0.0)), "sampling.temperature=0.0"),
    ("top_p", dict(sampling=SamplingParams(top_p=1.5)), "sampling.top_p=1.5"),
    ("top_k", dict(sampling=SamplingParams(top_k=-2)), "sampling.top_k=-2"),
    ("seed", dict(sampling=SamplingParams(seed=-1)), "sampling.seed=-1"),
    ("stop_tokens", dict(stop_tokens=(500,)), "stop_tokens"),
    ("stop_strings", dict(stop_strings=("",)), "stop_strings"),
])
def test_bad_requests_name_the_request_slot_and_field(engines, field, request_kw, match):
    eng = engines["gathered"]
    s, t = eng.allocate(), eng.allocate()
    good = TurnRequest(s, np.array([1, 2], np.int32), 1, GREEDY)
    kw = dict(slot=t, new_tokens=np.array([3], np.int32), max_new_tokens=2, sampling=GREEDY)
    kw.update(request_kw)
    before = eng.stats.snapshot()
    with pytest.raises(ValueError, match=rf"request 1 \(slot {kw['slot']}\): .*{match}"):
        eng.generate([good, TurnRequest(**kw)])
    assert eng.stats.dispatches == before.dispatches  # rejected before any device work
    assert eng.context_length(s) == 0
    eng.release(s)
    eng.release(t)


def test_slot_errors(engines, params):
    eng = engines["gathered"]
    s = eng.allocate()
    with pytest.raises(ValueError, match="request 1 .*appears twice"):
        eng.generate([TurnRequest(s, np.array([1]), 1), TurnRequest(s, np.array([2]), 1)])
    eng.release(s)
    for call in (lambda: eng.release(s), lambda: eng.context_length(s),
                 lambda: eng.fork(s, 2),
                 lambda: eng.generate([TurnRequest(s, np.array([1]), 1)])):
        with pytest.raises(ValueError, match=f"slot.*{s}.*not an allocated slot"):
            call()
    small = Engine(CFG, params, num_slots=2, max_context=WINDOW)
    with pytest.raises(ValueError, match="request 0 .*stop strings need .*detokenize"):
        small.generate([TurnRequest(small.allocate(), np.array([1]), 1, stop_strings=("x",))])
    small.release(0)
    x = small.allocate()
    with pytest.raises(ValueError, match="fork: slot 0 into k=2 needs 2 free slots, 1 are"):
        small.fork(x, 2)
    small.allocate()
    with pytest.raises(ValueError, match="all 2 slots are in use"):
        small.allocate()
    with pytest.raises(ValueError, match="max_context=64 exceeds"):
        Engine(CFG.replace(max_context=32), params, num_slots=1, max_context=64)
    with pytest.raises(ValueError, match="tree structure differs"):
        small.set_params({"embed": jnp.zeros(3)})
    with pytest.raises(ValueError, match=r"param \['embed'\] is \(128, 32\)"):
        small.set_params({**params, "embed": jnp.zeros((128, 32))})


def _same_turns(engs, seeds, lp_atol):
    """Two turns (one greedy, one sampled) through each engine: identical tokens and routing,
    log-probs within `lp_atol`, through prefill chunks and decode dispatches."""
    outs = []
    for eng in engs:
        a, b = eng.allocate(), eng.allocate()
        outs.append(eng.generate([
            TurnRequest(a, _prompt(seeds[0], 19), 9, GREEDY),
            TurnRequest(b, _prompt(seeds[1], 3), 6, SamplingParams(temperature=0.8, seed=5))]))
        eng.release(a)
        eng.release(b)
    for x, y in zip(*outs):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=lp_atol, rtol=0)
        np.testing.assert_array_equal(x.routing, y.routing)
        assert x.stop_reason == y.stop_reason


def _layers(eng):
    return {k: lp for blk in eng._run_params["blocks"] for k, lp in blk.items()}


def test_default_backend_engine_equals_as_trained(engines, params):
    """The CPU default (one block per layer, params sliced once; projections packed for the
    kernel or held output-first) serves the same tokens, log-probs and routing as the engine
    that reads the stacked params in place."""
    assert engines["whole"].backend in (DecodeBackend.CPU_PACKED, DecodeBackend.CPU_OUT_IN)
    stacked = Engine(CFG, params, num_slots=8, max_context=WINDOW, steps_per_dispatch=4,
                     prefill_chunk=8, backend="as_trained")
    assert stacked.backend == DecodeBackend.AS_TRAINED
    assert stacked._run_params is params  # read in place
    _same_turns([engines["whole"], stacked], (40, 41), 1e-5)


@pytest.mark.parametrize("backend", [MoeBackend.RAGGED_DOT, MoeBackend.GROUPED])
def test_out_in_engine_equals_unstacked(params, backend):
    """`cpu_out_in` (projections held output-first, and with GROUPED the routed experts too)
    serves the same tokens, log-probs and routing as the engine reading the unstacked params in
    their own [in, out] layout."""
    cfg = CFG.replace(moe_backend=backend)
    engs = [Engine(cfg, params, num_slots=4, max_context=WINDOW, steps_per_dispatch=4,
                   prefill_chunk=8, backend=b) for b in ("cpu_out_in", "cpu_unstacked")]
    layers = _layers(engs[0])
    assert isinstance(layers["0_mamba"]["in_x"], OutIn)
    assert isinstance(layers["0_moe"]["experts_up"], OutIn) == (backend == MoeBackend.GROUPED)
    assert not isinstance(layers["0_moe"]["router"], OutIn)
    assert not isinstance(_layers(engs[1])["0_mamba"]["in_x"], BackendWeight)
    _same_turns(engs, (42, 43), 1e-5)


def test_packed_engine_equals_out_in(params, cpu_kernel):
    """The CPU default where the kernel builds (`cpu_packed`: projections, LM head and the
    grouped experts packed for `cpu_gemm`) serves the same tokens, log-probs and routing as the
    output-first engine on XLA's products; so does a bf16 view of the params (packed as bf16,
    widened to float32 in the kernel, against XLA's products on the same view)."""
    cfg = CFG.replace(moe_backend=MoeBackend.GROUPED)
    engs = [Engine(cfg, params, num_slots=4, max_context=WINDOW, steps_per_dispatch=4,
                   prefill_chunk=8, backend=b) for b in (None, "cpu_out_in")]
    assert engs[0].backend == DecodeBackend.CPU_PACKED
    layers = _layers(engs[0])
    assert isinstance(layers["0_mamba"]["in_x"], cpu_gemm.Packed)
    assert isinstance(layers["0_moe"]["experts_up"], cpu_gemm.Packed)
    assert isinstance(engs[0]._run_params["lm_head"], cpu_gemm.Packed)
    _same_turns(engs, (44, 45), 1e-5)
    view = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.ndim >= 2 else a, params)
    for eng in engs:
        eng.set_params(view)
    in_x = _layers(engs[0])["0_mamba"]["in_x"]
    assert isinstance(in_x, cpu_gemm.Packed) and in_x.p.dtype == jnp.bfloat16
    assert isinstance(_layers(engs[1])["0_mamba"]["in_x"], OutIn)
    _same_turns(engs, (46, 47), 1e-5)


def test_default_backends_end_to_end(params):
    """What each platform runs by default, end to end (the tests above pin tiny's MoE dispatch
    to RAGGED_DOT): the MoE dispatch AUTO (on CPU the grouped tiles) and the engine's decode
    backend AUTO (one CPU device: projections and grouped experts packed for the kernel where
    it builds, else output-first) against full forwards of every context with the same
    dispatch; then, under a mesh (AUTO: the params read in place, the experts expert-parallel
    with grouped local tiles), the same tokens, log-probs and routing as one device."""
    cfg = CFG.replace(moe_backend=MoeBackend.AUTO)
    eng = Engine(cfg, params, num_slots=8, max_context=WINDOW, steps_per_dispatch=4,
                 prefill_chunk=8)
    assert eng.backend in (DecodeBackend.CPU_PACKED, DecodeBackend.CPU_OUT_IN)
    assert isinstance(_layers(eng)["0_moe"]["experts_up"], BackendWeight)  # grouped, laid out
    tr = Tracker(eng, cfg)
    a, b = eng.allocate(), eng.allocate()
    tr.new(a)
    tr.new(b)
    tr.generate([TurnRequest(a, _prompt(50, 11), 6, GREEDY),
                 TurnRequest(b, _prompt(51, 4), 5, SamplingParams(temperature=0.8, seed=6))])
    tr.generate([TurnRequest(a, _prompt(52, 3), 4, GREEDY),
                 TurnRequest(b, np.zeros(0, np.int32), 3, GREEDY)])
    tr.check(params, [a, b])
    eng.release(a)
    eng.release(b)

    mesh = make_mesh({"data": 2, "expert": 2, "tensor": 2})
    sharded = Engine(cfg, jax.device_put(params, param_shardings(cfg, mesh, DECODE_RULES)),
                     num_slots=8, max_context=WINDOW, mesh=mesh, steps_per_dispatch=4,
                     prefill_chunk=8)
    assert sharded.backend == DecodeBackend.AS_TRAINED
    _same_turns([sharded, eng], (53, 54), 1e-5)


def test_decode_backend_refusals_name_the_choice(params, monkeypatch):
    with pytest.raises(ValueError, match=r"Engine: backend='cpu_fast' must be one of"):
        Engine(CFG, params, num_slots=2, max_context=WINDOW, backend="cpu_fast")
    with pytest.raises(ValueError, match="backend='cpu_out_in' lays weights out for one device"):
        Engine(CFG, params, num_slots=2, max_context=WINDOW, mesh=make_mesh({"data": 8}),
               backend="cpu_out_in")
    # Under a mesh of several devices AUTO reads the params in place.
    assert backends.select(None, make_mesh({"data": 8})) == DecodeBackend.AS_TRAINED
    # Without the kernel AUTO falls back to XLA's products; asking for it is refused.
    monkeypatch.setattr(cpu_gemm, "ready", lambda: False)
    assert backends.select("auto") == DecodeBackend.CPU_OUT_IN
    with pytest.raises(ValueError, match="backend='cpu_packed' needs the CPU product kernel"):
        backends.select(DecodeBackend.CPU_PACKED)
