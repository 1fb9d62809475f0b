"""Token log-probs and entropies from the model's hidden states, chunked over positions.

A 131,072-entry vocabulary makes full logits the largest activation of a long row (fp32: 512 KiB
per token, 2 GiB for one 4,096-token sequence, more again for their gradient). We never build
them for the whole batch: the LM head runs on `chunk` positions at a time inside a `lax.map`,
each chunk under `jax.checkpoint`, so the backward pass recomputes one chunk's logits instead of
storing them all. Peak memory is O(B · chunk · V) instead of O(B · S · V). The price is a second
LM-head matmul per token in the backward pass (not counted as model FLOPs). Where memory is
plentiful and that product is the price (a one-device CPU: ~0.4 s of SmolLM2's 8 s update step),
`keep_logits` makes the rows' logits in one product and keeps them for the backward instead, as
transformers does; the update step asks its platform (`backends.training.TrainingPlatform`).

Why positions rather than vocabulary chunks with a running logsumexp: the LM head's vocabulary
axis is sharded over the `tensor` mesh axis (TRAIN_RULES), and slicing a sharded axis into
chunks forces either a re-layout or chunk-sized collectives. Chunking positions leaves every
chunk's logits laid out exactly like full logits (batch over data/fsdp, vocab over tensor); the
log-softmax of each position then sees its whole row of logits, so it is the ordinary, exact
`logsumexp`, with one cross-shard reduction.

Notation: b batch, s positions, c chunk, d width, v vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon import model as M
from avalon import sharding
from avalon.model.config import ModelConfig


def log_softmax_stats(logits: jax.Array, targets: jax.Array, *, on_mesh: bool = False
                      ) -> tuple[jax.Array, jax.Array]:
    """(log-prob of each target, entropy of each row) from fp32 logits [..., v] and targets
    [...]: the reference a platform's kernel replaces (`token_logprobs(stats=...)`). The entropy
    is a diagnostic and carries no gradient."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    if on_mesh:
        # A one-hot select instead of a gather: elementwise on the vocab-sharded logits, so
        # no cross-shard gather is needed.
        hit = jnp.arange(logits.shape[-1], dtype=jnp.int32) == targets[..., None].astype(jnp.int32)
        picked = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    else:
        # On one device a gather: the select writes, and its gradient reads, a full
        # [b, c, v] array (~135 ms of the toy's 7 s update step on one core).
        picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    logp = picked - lse
    lg, lse_sg = jax.lax.stop_gradient(logits), jax.lax.stop_gradient(lse)
    entropy = lse_sg - jnp.sum(jnp.exp(lg - lse_sg[..., None]) * lg, axis=-1)
    return logp, entropy


def token_logprobs(params: dict, hidden: jax.Array, targets: jax.Array, cfg: ModelConfig, *,
                   chunk: int, temperature: float = 1.0, stats=None,
                   keep_logits: bool = False, ops: M.Ops = M.PLAIN
                   ) -> tuple[jax.Array, jax.Array]:
    """log π(targets[b, s] | prefix) and the policy entropy at every position.

    hidden [b, s, d] is the pre-final-norm residual stream (`ForwardResult.hidden`); targets
    [b, s] int. The distribution is softmax(logits / temperature), the sampler's. Returns
    (logp [b, s] fp32, entropy [b, s] fp32); the entropy is a diagnostic and carries no gradient.
    `stats`: a platform kernel with `log_softmax_stats`'s function (logits, targets) -> (logp,
    entropy), used on one device (the update step's on CPU: `TrainingPlatform.log_softmax`).
    `keep_logits`: the whole rows in one chunk, their logits kept for the backward (O(b s V)
    memory, no recomputation); the same values. `ops`: the model's (`model.ops.Ops`).
    """
    b, s, d = hidden.shape
    if targets.shape != (b, s):
        raise ValueError(f"targets shape {targets.shape} does not match hidden {hidden.shape}")
    if chunk <= 0:
        raise ValueError(f"chunk={chunk}: must be a positive number of positions")

    on_mesh = sharding.active_mesh() is not None

    def one(h, tgt):  # h [b, c, d], tgt [b, c]
        logits = M.lm_logits(params, h, cfg, ops)  # [b, c, v] fp32 (named `head` in a profile)
        with jax.named_scope("logprobs"):
            return _pick(logits, tgt)

    def _pick(logits, tgt):
        if temperature != 1.0:
            logits = logits / temperature
        if stats is not None and not on_mesh:
            return stats(logits, tgt)
        return log_softmax_stats(logits, tgt, on_mesh=on_mesh)

    # Under sequence parallelism each row's positions are split over m chips (m = 1 without
    # it): chunk j then takes positions [j c, (j + 1) c) of *every* chip's part, so each chip
    # computes c positions' logits per chunk from its own hidden states, nothing moves, and
    # one chunk's logits per chip are [b, c, V] as without it.
    m = sharding.seq_shards()
    if s % m:
        raise ValueError(f"sequence length {s} is not divisible by the {m} chips its positions "
                         "are split over")
    local = s // m
    if local <= chunk or keep_logits:
        return one(hidden, targets)
    pad = (-local) % chunk
    n = (local + pad) // chunk
    hidden = hidden.reshape(b, m, local, d)
    targets = targets.reshape(b, m, local)
    if pad:
        hidden = jnp.pad(hidden, [(0, 0), (0, 0), (0, pad), (0, 0)])
        targets = jnp.pad(targets, [(0, 0), (0, 0), (0, pad)])
    # [b, m, n, c, ...] -> [n, b, m * c, ...]: chunk-major, each chunk laid out like a row.
    hs = hidden.reshape(b, m, n, chunk, d).transpose(2, 0, 1, 3, 4).reshape(n, b, m * chunk, d)
    ts = targets.reshape(b, m, n, chunk).transpose(2, 0, 1, 3).reshape(n, b, m * chunk)
    hs = sharding.constrain(hs, (None, "batch", "act_seq", "act_embed"))
    body = jax.checkpoint(one)
    logp, entropy = jax.lax.map(lambda xs: body(*xs), (hs, ts))  # [n, b, m * c] each

    def unchunk(x):
        x = x.reshape(n, b, m, chunk).transpose(1, 2, 0, 3).reshape(b, m, n * chunk)
        return x[:, :, :local].reshape(b, s)

    return unchunk(logp), unchunk(entropy)


def sequence_logprobs(params: dict, tokens: jax.Array, targets: jax.Array, cfg: ModelConfig, *,
                      segment_ids=None, routing=None, chunk: int, temperature: float = 1.0,
                      stats=None, keep_logits: bool = False, ops: M.Ops = M.PLAIN
                      ) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
    """Forward (with routing replay when `routing` [m, b, s, k] is given) then chunked token
    log-probs. Returns (logp [b, s], entropy [b, s], routing used [m, b, s, k] or None, choices
    dropped per MoE layer [m] or None: `ForwardResult.moe_dropped`)."""
    r = M.forward(params, tokens, cfg, segment_ids=segment_ids, routing=routing,
                  return_logits=False, ops=ops)
    logp, entropy = token_logprobs(params, r.hidden, targets, cfg, chunk=chunk,
                                   temperature=temperature, stats=stats, keep_logits=keep_logits,
                                   ops=ops)
    return logp, entropy, r.routing, r.moe_dropped
