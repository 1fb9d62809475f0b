"""Per-slot token sampling on device: temperature, top-k, top-p, greedy, per-slot seeds.

`sample(logits, knobs, positions)` draws one token per row and returns its log-probability.

Which log-probability. The returned value is log softmax(logits / T)[token]: the sampled token
under the temperature-scaled, *untruncated* distribution (greedy rows: T = 1). That is the
policy the trainer recomputes as pi_theta: the RL loss takes log-softmax of the model's logits
divided by the same temperature, over the whole vocabulary; it does not know about top-k/top-p.
With this choice the importance ratio pi_theta / pi_old of an on-policy token is exactly 1 (up
to float error between the decode and training forwards). Truncation (top-k / top-p) is then a
known off-policy effect: the behaviour policy is the renormalised truncated distribution, whose
log-prob is this value plus -log(kept mass). RL therefore refuses truncation at start-up
(`avalon/rl/config.check_rl_sampling`, naming `rollout.top_p` / `top_k`); top-k / top-p remain
for evaluation and inference.

Seeds. Row r's uniform draw is keyed by fold_in(key(seed[r]), position[r]), the position the
sampled token will occupy in the slot's context, so a slot's tokens depend only on its own seed
and context, never on which other slots share the batch or how turns were split into
dispatches. Forked rollouts therefore need distinct seeds to differ.

Sampling is by inverse CDF (one uniform per row, one cumulative sum), cheaper than Gumbel noise
over the vocabulary. Top-k / top-p sort the scaled logits only when some row asks for them
(`lax.cond`). Ties at the truncation threshold are all kept.

Notation: r rows (slots), v vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SamplingKnobs:
    """Per-row sampling parameters as device arrays [r]."""

    temperature: jax.Array  # float32, > 0 (ignored by greedy rows)
    top_p: jax.Array  # float32 in (0, 1]; 1 = off
    top_k: jax.Array  # int32 >= 0; 0 = off
    greedy: jax.Array  # bool
    seed: jax.Array  # uint32


def truncate(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Set to -inf every logit outside the row's top-k and top-p nucleus. scaled [r, v].

    The nucleus is the shortest prefix of tokens sorted by probability whose mass reaches top_p
    (token i is kept iff the mass strictly before it is < top_p); the best token is always
    kept."""
    v = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)  # [r, v], descending
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    rank = jnp.arange(v)[None, :]
    keep = (mass_before < top_p[:, None]) & ((top_k[:, None] <= 0) | (rank < top_k[:, None]))
    keep = keep | (rank == 0)
    n_keep = jnp.sum(keep, axis=-1)  # keep is a prefix: both conditions are monotone in rank
    threshold = jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1)  # [r, 1]
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def inverse_cdf(logits: jax.Array, u: jax.Array) -> jax.Array:
    """Token index per row with P(i) = softmax(logits)[i], from a uniform u [r] in [0, 1).

    The pick is the first index whose cumulative mass exceeds x = u * total. Keeping x strictly
    below the total (float rounding of u * total could reach it) means the cumulative sum rises
    at the pick, so a token without mass (masked, or underflowed) is never returned."""
    probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # unnormalised
    cdf = jnp.cumsum(probs, axis=-1)
    total = cdf[:, -1]
    x = jnp.minimum(u * total, jnp.nextafter(total, jnp.zeros_like(total)))
    return jnp.sum(cdf <= x[:, None], axis=-1).astype(jnp.int32)


def _draw(scaled: jax.Array, knobs: SamplingKnobs, positions: jax.Array) -> jax.Array:
    """Each row's token drawn from its (truncated) scaled softmax; greedy rows' draws unused."""
    needs_truncation = jnp.any(~knobs.greedy & ((knobs.top_p < 1.0) | (knobs.top_k > 0)))
    masked = jax.lax.cond(needs_truncation, truncate, _untruncated, scaled, knobs.top_p,
                          knobs.top_k)
    u = jax.vmap(_uniform)(knobs.seed, positions)
    return inverse_cdf(masked, u)


def _no_draw(scaled: jax.Array, knobs: SamplingKnobs, positions: jax.Array) -> jax.Array:
    del knobs, positions
    return jnp.zeros(scaled.shape[0], jnp.int32)


def _untruncated(scaled, top_p, top_k):
    del top_p, top_k
    return scaled


def _uniform(seed: jax.Array, position: jax.Array) -> jax.Array:
    key = jax.random.fold_in(jax.random.key(seed), position)
    return jax.random.uniform(key, (), jnp.float32)


def sample(logits: jax.Array, knobs: SamplingKnobs, positions: jax.Array):
    """logits [r, v] fp32; positions [r] int (where each sampled token will sit).

    Returns (tokens [r] int32, logprobs [r] fp32 under the untruncated scaled softmax)."""
    logits = logits.astype(jnp.float32)
    temperature = jnp.where(knobs.greedy, 1.0, knobs.temperature).astype(jnp.float32)
    scaled = logits / temperature[:, None]
    log_norm = jax.nn.logsumexp(scaled, axis=-1)  # a reduction: no [r, v] log-probs are kept

    # A batch of greedy rows only (evaluation, the benchmarks) skips the draw: its exp and
    # cumulative sum over the vocabulary cost ~2% of a toy decode step at 8 rows.
    drawn = jax.lax.cond(jnp.all(knobs.greedy), _no_draw, _draw, scaled, knobs, positions)
    tokens = jnp.where(knobs.greedy, jnp.argmax(logits, axis=-1).astype(jnp.int32), drawn)
    logprobs = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - log_norm
    return tokens, logprobs
