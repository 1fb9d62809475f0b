"""The RL core: batch types, collective advantages, CISPO/GKPO/SFT losses, packing, the update
step. Host-side rollout data lives in `avalon.rl.types` (the organisation simulator's contract).

    groups ─► build_rl_batch (advantages.py + packing.py) ─► TrainBatch (host numpy)
           ─► make_update_step(...)(state, batch) ─► (new TrainState, metrics)

Notation (array shapes in docstrings and comments; the model's own are in avalon/model):
  T tokens of one agent's context (a `TrajectoryRow`)   K rollouts in a group
  B sequences of a packed batch                          S positions of a packed sequence
  b, s, c  a micro-batch's rows, positions, and a chunk of positions (`logprobs.py`)
  m MoE layers, k experts per token (routing [B, S, m, k] in a batch, [m, b, s, k] in the model)
  i, k, t rollout, agent, token in the recipe's sums (docs/recipe.md §3; k there is an agent)
"""

from avalon.rl.advantages import gkpo_utility, rollout_reward, score_groups, token_advantages
from avalon.rl.batch import TrainBatch
from avalon.rl.build import BuildStats, build_rl_batch, build_sft_batch
from avalon.rl.config import CapMode, LossKind, RLConfig
from avalon.rl.logprobs import sequence_logprobs, token_logprobs
from avalon.rl.losses import cispo_loss, sft_loss
from avalon.rl.packing import PackRow, PackStats, pack_rows
from avalon.rl.update import TrainState, UpdateStep, make_optimizer, make_update_step

__all__ = [
    "BuildStats", "CapMode", "LossKind", "PackRow", "PackStats", "RLConfig", "TrainBatch",
    "TrainState", "UpdateStep", "build_rl_batch", "build_sft_batch", "cispo_loss",
    "gkpo_utility", "make_optimizer", "make_update_step", "pack_rows", "rollout_reward",
    "score_groups", "sequence_logprobs", "sft_loss", "token_advantages", "token_logprobs",
]
