"""From rollout groups (or SFT rows) to one packed host `TrainBatch`.

RL: score the groups (collective reward, group-relative advantage, zero-variance groups dropped),
give every row of every kept rollout its rollout's A_i plus its own turns' shaping, and pack.
SFT: the same row format with only the loss mask used (advantages and old log-probs are 0).
Either way the loss is taken on `trained_mask(row)`: sampled tokens, less those of skipped turns
(TokenFlag.SKIPPED: sampled after the end, after a fire, or past the wall clock; no effect).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from avalon.rl.advantages import AdvantageStats, score_groups, token_advantages
from avalon.rl.batch import TrainBatch
from avalon.rl.config import RLConfig
from avalon.rl.packing import PackRow, PackStats, pack_rows, pack_rows_with_roles
from avalon.rl.roles import role_metrics, row_role
from avalon.rl.types import RolloutGroup, TrajectoryRow, trained_mask


@dataclasses.dataclass(frozen=True)
class BuildStats:
    advantages: AdvantageStats | None  # None for SFT batches
    packing: PackStats
    # RL batches: int8 [B, S] role of each loss position (rl/roles.py) and its host metrics.
    roles: np.ndarray | None = None
    role: dict[str, float] = dataclasses.field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        """Flat host-side metrics (kept/dropped groups, rewards, fill, per-role loss tokens and
        mean advantage) to log beside the step's."""
        out = {f"pack_{k}": float(v) for k, v in dataclasses.asdict(self.packing).items()}
        if self.advantages is not None:
            out.update({k: float(v) for k, v in dataclasses.asdict(self.advantages).items()})
        out.update(self.role)
        return out


def _row_name(group_id, rollout: int | None, row: TrajectoryRow) -> str:
    where = "" if group_id is None else f"group {group_id} rollout {rollout} "
    return f"{where}agent {row.agent!r} ({row.role}) segment {row.segment}"


def build_rl_batch(groups: list[RolloutGroup], cfg: RLConfig, *, seq_len: int,
                   num_seqs_multiple: int = 1, min_seqs: int = 0,
                   routing_shape: tuple[int, int] | None = None
                   ) -> tuple[TrainBatch, BuildStats]:
    """Pack every row of every rollout in a kept group, each carrying its rollout's advantage.

    routing_shape (m, k): replay the sampler's routing (every row needs it); None: no replay.
    """
    scored, adv_stats = score_groups(groups, cfg)
    rows = []
    for g in scored:
        if g.advantages is None:
            continue
        for i, (rollout, a) in enumerate(zip(g.rollouts, g.advantages)):
            for row in rollout.rows:
                rows.append(PackRow(
                    tokens=np.asarray(row.tokens, np.int32), loss_mask=trained_mask(row),
                    old_logp=np.asarray(row.sampler_logp, np.float32),
                    advantages=token_advantages(row, float(a), cfg), routing=row.routing,
                    name=_row_name(g.group_id, i, row), role=row_role(row)))
    batch, pack_stats, roles = pack_rows_with_roles(
        rows, seq_len, num_seqs_multiple=num_seqs_multiple, min_seqs=min_seqs,
        routing_shape=routing_shape)
    return batch, BuildStats(adv_stats, pack_stats, roles, role_metrics(batch, roles))


def build_sft_batch(rows: list[TrajectoryRow], *, seq_len: int, num_seqs_multiple: int = 1,
                    min_seqs: int = 0) -> tuple[TrainBatch, BuildStats]:
    """Pack SFT rows (loss on `loss_mask` tokens: the demonstrated agent outputs); no replay."""
    packed = [PackRow(tokens=np.asarray(r.tokens, np.int32), loss_mask=trained_mask(r),
                      old_logp=np.zeros(len(r.tokens), np.float32),
                      advantages=np.zeros(len(r.tokens), np.float32), routing=None,
                      name=_row_name(None, None, r)) for r in rows]
    batch, pack_stats = pack_rows(packed, seq_len, num_seqs_multiple=num_seqs_multiple,
                                  min_seqs=min_seqs)
    return batch, BuildStats(None, pack_stats)
