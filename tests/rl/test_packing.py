"""Packing rows into fixed-length sequences: alignment, fill, errors."""

import numpy as np
import pytest

from avalon.rl.build import build_sft_batch
from avalon.rl.packing import PackRow, pack_rows
from tests.rl.helpers import make_row


def _pack_row(rng, length, routing_shape=None, name=""):
    r = make_row(rng, length, routing_shape=routing_shape)
    r.loss_mask[-1] = True  # at least one predictable loss token: never skipped
    adv = np.where(r.loss_mask, rng.normal(size=length), 0.0).astype(np.float32)
    return PackRow(r.tokens, r.loss_mask, r.sampler_logp, adv, r.routing, name=name)


def test_rows_are_placed_whole_and_shifted_by_one():
    rng = np.random.default_rng(0)
    rows = [_pack_row(rng, n, routing_shape=(3, 2)) for n in (9, 17, 5, 30, 12, 2)]
    batch, stats = pack_rows(rows, 32, num_seqs_multiple=4, routing_shape=(3, 2))
    assert batch.tokens.shape == (4, 32) and batch.routing.shape == (4, 32, 3, 2)
    assert stats.sequences == 4 and stats.tokens == sum(len(r.tokens) for r in rows)
    found = []
    for b in range(4):
        for seg in range(1, batch.segment_ids[b].max() + 1):
            pos = np.flatnonzero(batch.segment_ids[b] == seg)
            assert (np.diff(pos) == 1).all()  # contiguous
            match = [r for r in rows if len(r.tokens) == len(pos)
                     and (r.tokens == batch.tokens[b, pos]).all()]
            assert len(match) == 1
            r = match[0]
            found.append(len(pos))
            # Position s predicts token s+1 of the same row; the last position predicts nothing,
            # so a segment never predicts the first token of the next one.
            np.testing.assert_array_equal(batch.targets[b, pos[:-1]], r.tokens[1:])
            np.testing.assert_array_equal(batch.loss_mask[b, pos[:-1]], r.loss_mask[1:])
            assert not batch.loss_mask[b, pos[-1]]
            np.testing.assert_array_equal(batch.old_logp[b, pos[:-1]], r.old_logp[1:])
            np.testing.assert_array_equal(batch.advantages[b, pos[:-1]], r.advantages[1:])
            np.testing.assert_array_equal(batch.routing[b, pos], r.routing)  # input positions
    assert sorted(found) == sorted(len(r.tokens) for r in rows)
    pad = batch.segment_ids == 0
    assert pad.sum() == stats.padding and not batch.loss_mask[pad].any()
    assert stats.loss_tokens == sum(int(r.loss_mask[1:].sum()) for r in rows)


def test_fill_is_at_least_90_percent_on_a_realistic_mix():
    """Agent rows: many short specialist turns-so-far, fewer long CEO contexts (log-normal
    lengths, median ~900, clipped to the window) packed into 8,192-token sequences."""
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(900), 1.0, size=600), 64, 8192).astype(int)
    rows = [PackRow(np.zeros(n, np.int32), np.ones(n, bool), np.zeros(n, np.float32),
                    np.zeros(n, np.float32), None) for n in lengths]
    _, stats = pack_rows(rows, 8192, num_seqs_multiple=8)
    assert stats.fill >= 0.90, stats
    assert stats.tokens == lengths.sum()


def test_rows_without_loss_tokens_are_skipped():
    rng = np.random.default_rng(2)
    prompt_only = make_row(rng, 10, loss_frac=0.0)
    first_only = make_row(rng, 10, loss_frac=0.0)
    first_only.loss_mask[0] = True  # nothing predicts a row's first token
    live = make_row(rng, 10, loss_frac=1.0)
    batch, stats = build_sft_batch([prompt_only, first_only, live], seq_len=16)
    assert (stats.packing.rows, stats.packing.skipped_rows) == (1, 2)
    assert stats.packing.unpredictable_loss_tokens == 1
    assert batch.loss_mask.sum() == 9 and batch.routing is None


def test_errors_name_the_row():
    rng = np.random.default_rng(3)
    long = _pack_row(rng, 40, name="group 2 rollout 1 agent 'a3' (QA) segment 1")
    with pytest.raises(ValueError, match=r"agent 'a3' \(QA\) segment 1 has 40 tokens.*seq_len=32"):
        pack_rows([long], 32)
    no_routing = _pack_row(rng, 10, name="agent 'ceo'")
    with pytest.raises(ValueError, match=r"routing of agent 'ceo' has shape None.*\(10, 3, 2\)"):
        pack_rows([no_routing], 32, routing_shape=(3, 2))
