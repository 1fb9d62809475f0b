"""Packing trajectory rows of different lengths into fixed-length sequences.

Best-fit decreasing: rows sorted longest first, each placed in the open sequence with the least
room that still holds it (a new sequence when none does). On a realistic mix (many short
specialist rows, a few long CEO rows) this wastes a few percent; `PackStats.fill` reports the
share of non-padding tokens. The number of sequences is rounded up to `num_seqs_multiple`
(micro-batches × data-parallel size) with all-padding sequences.

A row longer than the sequence length is an error naming the agent: splitting it would drop the
prefix its later tokens were sampled with, so its log-probs (and routing) would no longer be the
sampler's. Choose `seq_len` ≥ the agent context window (rows are already cut at compaction).
Rows with no predictable loss token carry no gradient and are skipped (counted).
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from avalon.rl.batch import TrainBatch, empty_batch


@dataclasses.dataclass(frozen=True)
class PackRow:
    """One row to pack, arrays of length T aligned like `TrajectoryRow` (token t's own values)."""

    tokens: np.ndarray  # int [T]
    loss_mask: np.ndarray  # bool [T]: tokens[t] was sampled
    old_logp: np.ndarray  # float32 [T]: sampler log-prob of tokens[t]
    advantages: np.ndarray  # float32 [T]: advantage of tokens[t] (0 off the mask)
    routing: np.ndarray | None  # int [T, m, k]: experts chosen with tokens[t] as input
    name: str = ""  # for error messages ("rollout 3 agent 'a1' segment 0")
    role: int = 0  # a label for per-role diagnostics (rl/roles.py), copied to its targets


@dataclasses.dataclass(frozen=True)
class PackStats:
    rows: int  # rows packed
    skipped_rows: int  # rows with no predictable loss token (not packed)
    sequences: int  # B, padding sequences included
    tokens: int  # real tokens packed (every token that goes through the model)
    loss_tokens: int  # positions carrying loss
    unpredictable_loss_tokens: int  # loss_mask at a row's first token (nothing predicts it)
    padding: int  # padding positions
    fill: float  # tokens / (sequences * seq_len)


def pack_rows(rows: list[PackRow], seq_len: int, *, num_seqs_multiple: int = 1,
              min_seqs: int = 0, routing_shape: tuple[int, int] | None = None
              ) -> tuple[TrainBatch, PackStats]:
    """Pack `rows` into a host `TrainBatch` [B, seq_len] (see `avalon.rl.batch` for alignment).

    routing_shape: (m MoE layers, k) to build the routing replay field (every row must then have
    routing of that shape); None builds a batch without replay (`routing=None`).
    """
    batch, stats, _ = pack_rows_with_roles(rows, seq_len, num_seqs_multiple=num_seqs_multiple,
                                           min_seqs=min_seqs, routing_shape=routing_shape)
    return batch, stats


def pack_rows_with_roles(rows: list[PackRow], seq_len: int, *, num_seqs_multiple: int = 1,
                         min_seqs: int = 0, routing_shape: tuple[int, int] | None = None
                         ) -> tuple[TrainBatch, PackStats, np.ndarray]:
    """`pack_rows`, and int8 [B, seq_len]: each loss position's `PackRow.role` (0 elsewhere)."""
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: must be at least 2 (a token and its target)")
    if num_seqs_multiple < 1:
        raise ValueError(f"num_seqs_multiple={num_seqs_multiple}: must be >= 1")
    kept, skipped, unpredictable = [], 0, 0
    for i, r in enumerate(rows):
        _check_row(r, i, seq_len, routing_shape)
        mask = np.asarray(r.loss_mask, bool)
        unpredictable += int(mask[:1].sum())
        if not mask[1:].any():
            skipped += 1
            continue
        kept.append(r)

    bins = _best_fit_decreasing([len(r.tokens) for r in kept], seq_len)
    # Never an empty batch (a step over no loss tokens is skipped on device, see update.py).
    n = max(len(bins), min_seqs, 1)
    n = -(-n // num_seqs_multiple) * num_seqs_multiple
    batch = empty_batch(n, seq_len, routing_shape)
    roles = np.zeros((n, seq_len), np.int8)
    for b, members in enumerate(bins):
        offset = 0
        for seg, i in enumerate(members, start=1):
            r = kept[i]
            roles[b, offset:offset + len(r.tokens) - 1] = np.where(r.loss_mask[1:], r.role, 0)
            offset = _place(batch, b, offset, seg, r)
    tokens = sum(len(r.tokens) for r in kept)
    stats = PackStats(
        rows=len(kept), skipped_rows=skipped, sequences=n, tokens=tokens,
        loss_tokens=int(batch.loss_mask.sum()), unpredictable_loss_tokens=unpredictable,
        padding=n * seq_len - tokens, fill=tokens / (n * seq_len) if n else 0.0)
    return batch, stats, roles


def _check_row(r: PackRow, i: int, seq_len: int, routing_shape) -> None:
    name = r.name or f"row {i}"
    t = len(r.tokens)
    for f in ("loss_mask", "old_logp", "advantages"):
        if len(getattr(r, f)) != t:
            raise ValueError(f"PackRow.{f} of {name} has length {len(getattr(r, f))}, tokens "
                             f"has {t}")
    if t > seq_len:
        raise ValueError(f"{name} has {t} tokens, more than seq_len={seq_len}; raise seq_len to "
                         "the agent context window (a row is never split: its log-probs depend "
                         "on its whole prefix)")
    if routing_shape is not None:
        want = (t, *routing_shape)
        if r.routing is None or tuple(r.routing.shape) != want:
            got = None if r.routing is None else tuple(r.routing.shape)
            raise ValueError(f"PackRow.routing of {name} has shape {got}; routing replay needs "
                             f"{want} (tokens, MoE layers, experts per token)")


def _best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` per bin. Open bins are kept sorted by free room for bisection."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free room, bin index), sorted
    for i in order:
        need = lengths[i]
        j = bisect.bisect_left(room, (need, -1))
        if j == len(room):
            bins.append([i])
            free, b = capacity - need, len(bins) - 1
        else:
            free, b = room.pop(j)
            bins[b].append(i)
            free -= need
        if free > 0:
            bisect.insort(room, (free, b))
    return bins


def _place(batch: TrainBatch, b: int, offset: int, seg: int, r: PackRow) -> int:
    """Write row r into sequence b at `offset` as segment `seg`; return the next offset."""
    t = len(r.tokens)
    sl, tl = slice(offset, offset + t), slice(offset, offset + t - 1)
    batch.tokens[b, sl] = r.tokens
    batch.segment_ids[b, sl] = seg
    # Position s predicts token s+1 of the same row; the row's last position predicts nothing.
    batch.targets[b, tl] = r.tokens[1:]
    batch.loss_mask[b, tl] = np.asarray(r.loss_mask[1:], bool)
    batch.old_logp[b, tl] = np.where(r.loss_mask[1:], r.old_logp[1:], 0.0)
    batch.advantages[b, tl] = np.where(r.loss_mask[1:], r.advantages[1:], 0.0)
    if batch.routing is not None:
        batch.routing[b, sl] = r.routing
    return offset + t
