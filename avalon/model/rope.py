"""Rotary position embedding (the Llama/Qwen families' `*` layers), as transformers computes it.

    inv_freq[i] = 1 / theta^(2i / r)        i < r / 2, r = rotary_dim (head_dim by default)
    angle[p, i] = p * inv_freq[i]           fp32, p the token's position in its sequence
    x_rot = x * cos(angle') + rotate_half(x) * sin(angle'),  angle' = [angle, angle]
    rotate_half([x1, x2]) = [-x2, x1]       (the two halves of the rotated dims)

Only the first r dims of each head rotate; the rest pass through (`partial_rotary_factor`).
Scalings (`RopeScaling`): LINEAR divides every frequency by the factor; LLAMA3 (Llama 3.1)
divides the frequencies whose wavelength exceeds original_max / low_freq_factor, keeps those
under original_max / high_freq_factor, and interpolates smoothly between. The frequencies are
numpy constants of the config, computed once.

Positions: a cached forward's row b continues at `lengths[b]`; a packed training row restarts
at 0 at every change of segment id (`segment_positions`), so a packed sequence rotates exactly
as it would alone.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from avalon.model.config import ModelConfig, RopeScaling


def rotary_dim(cfg: ModelConfig) -> int:
    return cfg.head_dim if cfg.rotary_dim is None else cfg.rotary_dim


@functools.cache
def inv_freq(cfg: ModelConfig) -> np.ndarray:
    """[rotary_dim / 2] fp32 inverse frequencies, scaled per `cfg.rope_scaling`."""
    r = rotary_dim(cfg)
    exponent = np.arange(0, r, 2, dtype=np.int64).astype(np.float32) / np.float32(r)
    freq = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
    if cfg.rope_scaling == RopeScaling.LINEAR:
        freq = freq / np.float32(cfg.rope_factor)
    elif cfg.rope_scaling == RopeScaling.LLAMA3:
        factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old = cfg.rope_original_max_position
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > old / low, freq / factor, freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return freq.astype(np.float32)


def segment_positions(segment_ids: jax.Array | None, b: int, t: int) -> jax.Array:
    """[b, t] int32: each token's position within its segment (a change of id starts a new
    sequence at 0); without segment ids, 0..t-1."""
    pos = jnp.arange(t, dtype=jnp.int32)
    if segment_ids is None:
        return jnp.broadcast_to(pos, (b, t))
    new = jnp.concatenate([jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
                          axis=1)
    start = jax.lax.cummax(jnp.where(new, pos[None, :], 0), axis=1)
    return pos[None, :] - start


def apply_rope(x: jax.Array, positions: jax.Array, cfg: ModelConfig, *,
               bound: int | None = None) -> jax.Array:
    """x [b, t, heads, d] rotated at positions [b, t]; angles, cos and sin in fp32, the
    products in x's dtype (as transformers).

    `bound`: every position is known to be < bound (a forward without a cache: positions within
    a row). cos and sin are then taken once for positions 0..bound-1 and gathered at each
    token's position, the same values: XLA:CPU otherwise fuses cos and sin into the rotation
    and takes them again for every head of every element (~0.25 s of SmolLM2's 8 s update
    step on one core, forward and backward; experiments/bench/RESULTS.md)."""
    r = rotary_dim(cfg)
    freq = jnp.asarray(inv_freq(cfg))
    if bound is None:
        angle = positions.astype(jnp.float32)[..., None] * freq  # [b, t, r/2]
        cos, sin = jnp.cos(angle), jnp.sin(angle)
    else:
        table = jnp.arange(bound, dtype=jnp.float32)[:, None] * freq  # [bound, r/2]
        cos, sin = jnp.cos(table)[positions], jnp.sin(table)[positions]
    cos = jnp.concatenate([cos, cos], axis=-1)[:, :, None, :].astype(x.dtype)  # [b, t, 1, r]
    sin = jnp.concatenate([sin, sin], axis=-1)[:, :, None, :].astype(x.dtype)
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    out = rot * cos + rotated * sin
    return out if r == x.shape[-1] else jnp.concatenate([out, rest], axis=-1)
