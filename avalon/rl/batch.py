"""The device batch of the update step: packed fixed-length sequences, one pytree.

Notation: B packed sequences (rows of the batch), S the sequence length, m MoE layers, k experts
per token. Every field has the batch axis first, so one sharding rule (batch over data × fsdp)
and one micro-batch split apply to all of them.

Alignment. Position s of a sequence holds `tokens[s]`; the model's output at s predicts
`targets[s]`, the next token of the *same* segment. The last token of a segment (and every
padding position) has no target: `loss_mask` is False there, so a segment never predicts the
first token of the next one. `old_logp`, `advantages` and `loss_mask` are given at the target
positions (they describe `targets[s]`, the sampled token), while `routing[s]` is the expert
choice made with `tokens[s]` as the input, which is exactly what the forward at s replays.

`segment_ids` number the segments of a sequence 1, 2, ...; padding has id 0 (its own segment,
so attention and Mamba state never mix it with real tokens; it is at the end anyway).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import struct


@struct.dataclass
class TrainBatch:
    """Arrays are numpy on the host and jax.Array on device; shapes as in the module doc."""

    tokens: jax.Array  # int32 [B, S] model inputs
    targets: jax.Array  # int32 [B, S] the token each position predicts (0 where none)
    segment_ids: jax.Array  # int32 [B, S] 1.. per packed segment, 0 = padding
    loss_mask: jax.Array  # bool [B, S] targets[s] was sampled by the policy (carries loss)
    old_logp: jax.Array  # float32 [B, S] sampler log-prob of targets[s] (0 off the mask)
    advantages: jax.Array  # float32 [B, S] A_i + shaping at targets[s] (0 off the mask)
    # [B, S, m, k] experts chosen with tokens[s] as input: int32 on the host; on device the
    # narrowest unsigned type holding the expert ids (`routing_dtype`: Super's 512 -> uint16,
    # half of int32's 29.7 GB per chip for a 131K-token pod batch).
    routing: jax.Array | None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)

    def model_routing(self):
        """Routing in the model's layout [m, B, S, k] (None when not replaying)."""
        return None if self.routing is None else self.routing.transpose(2, 0, 1, 3)


def routing_dtype(num_experts: int) -> np.dtype:
    """The narrowest unsigned integer dtype that holds expert ids 0..num_experts-1."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if num_experts - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"num_experts={num_experts}: more experts than uint32 ids")


def empty_batch(num_seqs: int, seq_len: int, routing_shape: tuple[int, int] | None) -> TrainBatch:
    """All-padding host batch; padding routing is experts 0..k-1 (valid and distinct)."""
    b, s = num_seqs, seq_len
    routing = None
    if routing_shape is not None:
        m, k = routing_shape
        routing = np.broadcast_to(np.arange(k, dtype=np.int32), (b, s, m, k)).copy()
    return TrainBatch(
        tokens=np.zeros((b, s), np.int32), targets=np.zeros((b, s), np.int32),
        segment_ids=np.zeros((b, s), np.int32), loss_mask=np.zeros((b, s), bool),
        old_logp=np.zeros((b, s), np.float32), advantages=np.zeros((b, s), np.float32),
        routing=routing)
