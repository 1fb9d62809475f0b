"""RL and SFT losses: pure functions of per-token arrays (the model is never run in here).

All take arrays of one shape (e.g. [b, s]) and a loss mask; tokens off the mask contribute
nothing to the loss, its gradient, or the metrics. Normalisation is token-level over *every*
loss token of the batch (all agents of all rollouts): pass `num_tokens` = the batch's total
when a micro-batch is evaluated alone, so the micro-batch losses sum to the batch loss.

CISPO (MiniMax-M1), the loss SPEC §3 gives:

    ρ_t  = exp(logp_t − old_logp_t)
    w_t  = sg(clip(ρ_t, lo, hi))          lo = 1 − eps_low
                                          hi = 1 + eps_high (CapMode.DELTA, the default)
                                             = eps_high     (CapMode.ABSOLUTE)
    loss = −(1/N) Σ_t mask_t · w_t · A_t · logp_t

so ∂loss/∂logp_t = −w_t · A_t / N: clipping changes a token's weight but never removes its
gradient, and no gradient flows through the weight (the stop-gradient sg). GKPO feeds its
utility-based advantages through this same loss.

Metrics are per-call statistics with a reduction each (`REDUCTIONS`), so the update step can
combine micro-batches exactly: means are weighted by `loss_tokens`, max/min reduce, sums add.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from avalon.rl.config import CapMode, clip_bounds


class Reduce(enum.Enum):
    SUM = "sum"
    MEAN = "mean"  # weighted by loss_tokens
    MAX = "max"
    MIN = "min"


REDUCTIONS = {
    "loss": Reduce.SUM,  # already divided by the batch-wide token count
    "loss_tokens": Reduce.SUM,
    "ratio_mean": Reduce.MEAN,
    "ratio_max": Reduce.MAX,
    "ratio_min": Reduce.MIN,
    "clipped_frac": Reduce.MEAN,
    "clipped_high_frac": Reduce.MEAN,
    "clipped_low_frac": Reduce.MEAN,
    "nll": Reduce.MEAN,
    "entropy": Reduce.MEAN,
    # MoE choices dropped at the expert-parallel capacity bound (RLConfig.moe_capacity_factor),
    # over all MoE layers and tokens of the batch (padding included, except a micro-batch of
    # padding only, which is not run); 0 when dropless.
    "moe_dropped_choices": Reduce.SUM,
    # Micro-batches without a loss token, not run (`update.make_update_step`).
    "empty_micro_batches": Reduce.SUM,
}


def _masked_mean(x, mask, count):
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1)


def cispo_loss(logp, old_logp, advantages, mask, *, eps_low: float, eps_high: float,
               cap_mode: CapMode, num_tokens=None) -> tuple[jax.Array, dict]:
    """CISPO loss (see module doc) and ratio diagnostics over the masked tokens.

    logp: the policy's log-probs (differentiated); old_logp: the sampler's; advantages: A_t
    (shaping included); mask: bool, True on loss tokens. num_tokens: the normaliser N
    (default: this call's mask count). Returns (scalar loss, metrics dict of scalars).
    """
    lo, hi = clip_bounds(eps_low, eps_high, cap_mode)
    mask = mask.astype(bool)
    count = jnp.sum(mask, dtype=jnp.int32)
    n = count if num_tokens is None else num_tokens
    # Off-mask positions may hold anything (padding): zero them before exp and the product so
    # neither the loss nor its gradient can pick up an inf or NaN from them.
    ratio = jnp.exp(jnp.where(mask, logp - old_logp, 0.0))
    weight = jax.lax.stop_gradient(jnp.clip(ratio, lo, hi))
    adv = jnp.where(mask, advantages, 0.0)
    per_token = -weight * adv * jnp.where(mask, logp, 0.0)
    loss = jnp.sum(per_token) / jnp.maximum(n, 1).astype(jnp.float32)

    ratio = jax.lax.stop_gradient(ratio)
    high, low = ratio > hi, ratio < lo
    metrics = {
        "loss": loss,
        "loss_tokens": count,
        "ratio_mean": _masked_mean(ratio, mask, count),
        "ratio_max": jnp.max(jnp.where(mask, ratio, -jnp.inf)),
        "ratio_min": jnp.min(jnp.where(mask, ratio, jnp.inf)),
        "clipped_frac": _masked_mean((high | low).astype(jnp.float32), mask, count),
        "clipped_high_frac": _masked_mean(high.astype(jnp.float32), mask, count),
        "clipped_low_frac": _masked_mean(low.astype(jnp.float32), mask, count),
    }
    return loss, metrics


def sft_loss(logp, mask, *, num_tokens=None) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy −(1/N) Σ mask_t · logp_t on the loss tokens (the demonstrated
    outputs). Returns (scalar loss, metrics: loss, loss_tokens, nll = mean NLL of this call)."""
    mask = mask.astype(bool)
    count = jnp.sum(mask, dtype=jnp.int32)
    n = count if num_tokens is None else num_tokens
    total = -jnp.sum(jnp.where(mask, logp, 0.0))
    loss = total / jnp.maximum(n, 1).astype(jnp.float32)
    nll = jax.lax.stop_gradient(total) / jnp.maximum(count, 1).astype(jnp.float32)
    return loss, {"loss": loss, "loss_tokens": count, "nll": nll}


def combine_metrics(stacked: dict) -> dict:
    """Reduce metrics stacked over micro-batches (leading axis) per `REDUCTIONS`."""
    out = {}
    weights = stacked["loss_tokens"].astype(jnp.float32)
    for key, x in stacked.items():
        how = REDUCTIONS[key]
        if how == Reduce.SUM:
            out[key] = jnp.sum(x, axis=0)
        elif how == Reduce.MAX:
            out[key] = jnp.max(x, axis=0)
        elif how == Reduce.MIN:
            out[key] = jnp.min(x, axis=0)
        else:
            out[key] = jnp.sum(x * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    return out
