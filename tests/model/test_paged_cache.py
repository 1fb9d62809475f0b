"""Paged KV against the contiguous cache (the reference), through the whole forward.

A tiny hybrid runs the same schedule twice, once per cache kind: rows get turns of different
lengths (prefill chunks, then one-token greedy decode steps), some rows sit out calls, finished
rows are released and new turns admitted into them while the others keep decoding. The paged run
takes its pages from a shuffled free list (so a row's pages are scattered through the pool and
pages of released rows are reused with stale contents). Logits must agree at every step and the
greedy tokens must be equal.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.backends import cpu_bits
from avalon.model import attention as A
from avalon.model.cache import Cache, init_cache, init_paged_cache

CFG = M.presets.get("tiny", time_step_min=0.0)
ROWS, CAPACITY, PAGE, POOL = 4, 64, 4, 48
WIDTH = CAPACITY // PAGE


@jax.jit
def _step(params, tokens, cache, num_new):
    r = M.forward(params, tokens, CFG, cache=cache, num_new=num_new)
    return r.logits, r.cache


def _reset_rows(cache: Cache, rows) -> Cache:
    """Rows emptied (released, then re-admitted): Mamba state and length zeroed."""
    mask = np.zeros(ROWS, bool)
    mask[list(rows)] = True
    m = jnp.asarray(mask)

    def zero(entry):
        if isinstance(entry, (A.KVCache, A.PagedKV)):
            return entry  # stale KV is never read: positions >= length are masked
        return jax.tree.map(lambda a: jnp.where(m.reshape(1, -1, *[1] * (a.ndim - 2)), 0, a),
                            entry)
    blocks = [{k: zero(e) for k, e in blk.items()} for blk in cache.blocks]
    return cache.replace(blocks=blocks, lengths=jnp.where(m, 0, cache.lengths))


class Pages:
    """A host page allocator: a shuffled free list, per-row page lists."""

    def __init__(self, seed):
        self.free = list(np.random.default_rng(seed).permutation(POOL))
        self.rows = [[] for _ in range(ROWS)]

    def ensure(self, row, n_tokens):
        while len(self.rows[row]) * PAGE < n_tokens:
            self.rows[row].append(int(self.free.pop()))

    def release(self, row):
        self.free.extend(self.rows[row])
        self.rows[row] = []

    def table(self):
        t = np.full((ROWS, WIDTH), POOL, np.int32)
        for r, pg in enumerate(self.rows):
            t[r, :len(pg)] = pg
        return jnp.asarray(t)


def test_paged_equals_contiguous_with_admission_and_release():
    params = M.init_params(jax.random.key(0), M.presets.get("tiny"))
    rng = np.random.default_rng(0)
    contiguous = init_cache(CFG, ROWS, CAPACITY)
    paged = init_paged_cache(CFG, ROWS, POOL, PAGE)
    alloc = Pages(1)
    lengths = np.zeros(ROWS, np.int64)
    last = np.zeros(ROWS, np.int32)  # each decoding row's next input: its greedy token
    # (turn length, tokens to decode) per admitted turn, per row; rows start at different times.
    queue = {0: [(11, 9), (3, 14)], 1: [(2, 6), (17, 5), (5, 4)], 2: [(7, 20)], 3: [(1, 3)] * 4}
    state = {r: None for r in range(ROWS)}  # row -> [prompt left, decode left]
    checked = 0
    for step in range(40):
        released = []
        for r in range(ROWS):
            if state[r] is None and queue[r] and (step >= r or r == 0):
                if lengths[r]:
                    released.append(r)
                prompt, n_dec = queue[r].pop(0)
                state[r] = [rng.integers(0, CFG.vocab_size, prompt).astype(np.int32), n_dec]
        if released:
            contiguous, paged = _reset_rows(contiguous, released), _reset_rows(paged, released)
            for r in released:
                alloc.release(r)
                lengths[r] = 0
        tokens = np.zeros((ROWS, 8), np.int32)
        num_new = np.zeros(ROWS, np.int32)
        for r in range(ROWS):
            if state[r] is None or (step % 5 == 4 and r == 2):  # row 2 sits out some calls
                continue
            prompt, n_dec = state[r]
            if len(prompt):
                part = prompt[:8]
                state[r][0] = prompt[len(part):]
            else:
                part = last[r:r + 1]
            tokens[r, :len(part)] = part
            num_new[r] = len(part)
            alloc.ensure(r, lengths[r] + len(part))
        if not num_new.any():
            continue
        logits_c, contiguous = _step(params, jnp.asarray(tokens), contiguous,
                                     jnp.asarray(num_new))
        logits_p, paged = _step(params, jnp.asarray(tokens), paged.replace(pages=alloc.table()),
                                jnp.asarray(num_new))
        logits_c, logits_p = np.asarray(logits_c), np.asarray(logits_p)
        for r in np.flatnonzero(num_new):
            n = num_new[r]
            np.testing.assert_allclose(logits_p[r, :n], logits_c[r, :n], atol=1e-5, rtol=0,
                                       err_msg=f"step {step} row {r}")
            greedy_c, greedy_p = np.argmax(logits_c[r, n - 1]), np.argmax(logits_p[r, n - 1])
            assert greedy_c == greedy_p, f"step {step} row {r}: greedy tokens differ"
            checked += 1
            lengths[r] += n
            if not len(state[r][0]):  # prompt absorbed: decode from its greedy token
                last[r] = greedy_c
                if state[r][1] == 0:
                    state[r] = None
                else:
                    state[r][1] -= 1
        np.testing.assert_array_equal(np.asarray(paged.lengths), lengths)
    assert checked > 60
    assert all(not q for q in queue.values())
    # Pages freed by released rows were handed out again (stale contents never read).
    assert len(alloc.free) + sum(map(len, alloc.rows)) == POOL


def test_paged_attention_blocks_equal_one_block():
    """The online softmax over several page blocks equals the contiguous scores path."""
    rng = np.random.default_rng(3)
    b, nq, h, g, d, size, w = 2, 5, 2, 2, 8, 4, 8
    q = jnp.asarray(rng.normal(size=(b, nq, h, g, d)), jnp.float32)
    pool = A.PagedKV(k=jnp.asarray(rng.normal(size=(20, h, size, d)), jnp.float32),
                     v=jnp.asarray(rng.normal(size=(20, h, size, d)), jnp.float32))
    pages = jnp.asarray(rng.permutation(20)[:b * w].reshape(b, w), jnp.int32)
    q_pos = jnp.asarray([[3, 9, 17, 25, 31], [0, 1, 2, 30, 12]], jnp.int32)
    old = A.PAGE_BLOCK
    try:
        A.PAGE_BLOCK = 2  # 4 blocks of 2 pages
        out = A._paged_attention(q, pool, pages, q_pos, d ** -0.5, jnp.float32)
    finally:
        A.PAGE_BLOCK = old
    k = jnp.take(pool.k, pages, axis=0).swapaxes(1, 2).reshape(b, h, w * size, d)
    v = jnp.take(pool.v, pages, axis=0).swapaxes(1, 2).reshape(b, h, w * size, d)
    mask = (jnp.arange(w * size)[None, None, :] <= q_pos[:, :, None])[:, None, None]
    ref = A._scores_to_out(q, k, v, mask, d ** -0.5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=0)


def test_bf16_pool_is_stored_as_bits_and_reads_as_its_values():
    """On CPU a bf16 pool is stored as its bit patterns (uint16, `backends.cpu_bits`: XLA:CPU
    widened a whole bf16 pool around every scatter; elsewhere as bf16). A write puts each new
    token's bf16 bits at its position and leaves every other entry as it was, in either storage;
    attention over the bits equals attention over the same pool held as bf16 values, exactly."""
    rng = np.random.default_rng(4)
    b, t, h, g, d, size, w, n = 2, 3, 2, 2, 8, 4, 4, 12
    bf16 = jnp.bfloat16
    assert cpu_bits.storage_dtype(bf16, "cpu") == jnp.uint16
    assert cpu_bits.storage_dtype(jnp.float16, "cpu") == jnp.uint16
    assert cpu_bits.storage_dtype(jnp.float32, "cpu") == jnp.float32
    assert cpu_bits.storage_dtype(bf16, "tpu") == bf16
    assert cpu_bits.storage_dtype(bf16, "gpu") == bf16
    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    assert A.init_paged_kv(cfg, 3, size, jnp.uint16).k.dtype == jnp.uint16
    assert A.init_paged_kv(cfg, 3, size).k.dtype == bf16
    before = jnp.asarray(rng.normal(size=(n, h, size, d)), bf16)
    pool = A.to_storage(before, bf16, jnp.uint16)
    pages = jnp.asarray(rng.permutation(n)[:b * w].reshape(b, w), jnp.int32)
    start = jnp.asarray([2, 7], jnp.int32)
    new = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    written = A._write_pages(pool, new, pages, start, None, bf16)
    assert written.dtype == jnp.uint16
    as_values = A._write_pages(before, new, pages, start, None, bf16)  # another platform's
    assert as_values.dtype == bf16
    np.testing.assert_array_equal(np.asarray(A.from_storage(written, bf16), np.float32),
                                  np.asarray(as_values, np.float32))
    got = np.asarray(A.from_storage(written, bf16), np.float32)
    want = np.asarray(before, np.float32).copy()
    for r in range(b):
        for i in range(t):
            pos = int(start[r]) + i
            want[int(pages[r, pos // size]), :, pos % size] = np.asarray(new[r, i].astype(bf16),
                                                                          np.float32)
    np.testing.assert_array_equal(got, want)

    q = jnp.asarray(rng.normal(size=(b, t, h, g, d)), bf16)
    q_pos = start[:, None] + jnp.arange(t)[None, :]
    as_bits = A.PagedKV(k=written, v=written)
    as_values = A.PagedKV(k=A.from_storage(written, bf16), v=A.from_storage(written, bf16))
    out_bits = A._paged_attention(q, as_bits, pages, q_pos, d ** -0.5, bf16)
    out_values = A._paged_attention(q, as_values, pages, q_pos, d ** -0.5, bf16)
    np.testing.assert_array_equal(np.asarray(out_bits, np.float32),
                                  np.asarray(out_values, np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_take_rows_equals_take_and_its_gradient(dtype):
    """The embedding lookup through bit patterns (the CPU path, and `take_rows` here) gives
    jnp.take's rows and jnp.take's gradient (repeated ids add up)."""
    rng = np.random.default_rng(5)
    table = jnp.asarray(rng.normal(size=(11, 6)), dtype)
    idx = jnp.asarray([[3, 0, 3], [10, 7, 3]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(cpu_bits.take_rows(table, idx), np.float32),
                                  np.asarray(jnp.take(table, idx, axis=0), np.float32))
    cot = jnp.asarray(rng.normal(size=(2, 3, 6)), dtype)
    loss = lambda f: lambda tb: jnp.sum(f(tb).astype(jnp.float32) * cot.astype(jnp.float32))
    want = jax.grad(loss(lambda tb: jnp.take(tb, idx, axis=0)))(table)
    takes = [cpu_bits.take_rows]
    if dtype == jnp.bfloat16:
        takes.append(cpu_bits._take_rows_as_bits)
    for take in takes:
        got = jax.grad(loss(functools.partial(take, idx=idx)))(table)
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32),
                                      np.asarray(want, np.float32))


@pytest.mark.parametrize("t,num_new", [(1, None), (1, [1, 0, 1]), (5, [5, 2, 0]), (9, None)])
def test_window_writes_equal_whole_page_writes(t, num_new):
    """CPU's KV write (each token's [h, d] window scattered in place) leaves the pool exactly
    as the whole-page merge other platforms run: tokens across page boundaries, rows writing
    fewer tokens than they carry (num_new) or none, and positions past a row's page table
    (dropped)."""
    rng = np.random.default_rng(6)
    b, h, d, size, w, n = 3, 2, 4, 4, 3, 16
    pool = jnp.asarray(rng.normal(size=(n, h, size, d)), jnp.float32)
    pages = jnp.asarray(rng.permutation(n)[:b * w].reshape(b, w), jnp.int32)
    start = jnp.asarray([0, 3, 7], jnp.int32)  # row 2 with t = 9 runs past its 12 positions
    new = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    nn = None if num_new is None else jnp.asarray(num_new, jnp.int32)
    for dtype in (jnp.float32, jnp.bfloat16):
        stored = cpu_bits.storage_dtype(dtype, "cpu")
        p0 = A.to_storage(pool, dtype, stored)
        windows = A._write_windows(p0, new, pages, start, nn, dtype)
        whole = A._write_whole_pages(p0, new, pages, start, nn, dtype)
        assert windows.dtype == whole.dtype == stored
        np.testing.assert_array_equal(np.asarray(windows), np.asarray(whole))
        assert not np.array_equal(np.asarray(windows), np.asarray(p0))  # tokens landed
