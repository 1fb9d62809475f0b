"""The engine's decode weights: a bf16 view of the trainer's fp32 master, and its cost.

The trainer's params exist once, in fp32 (the master AdamW updates). The engine decodes from a
*view* of them: every weight matrix cast to bf16 and placed in the decode layout (DECODE_RULES),
in one jitted pass on device (no host copy). Vectors (norm scales, biases, Mamba's A_log, D,
dt_bias) keep the master dtype: they are a rounding error of the bytes and the numerics they
touch (norms, the SSM decay) are the sensitive ones. Producing the view is the "switch" of an
RL step; `DecodeView.__call__` times it and `nbytes` counts what it writes.

The price of decoding in bf16 is a sampler/trainer mismatch: the sampler's log-probs (pi_old)
come from the bf16 forward, the trainer's from fp32. `mismatch_stats` summarises it per batch
(what the RL frameworks that hit this log); the CISPO update's `ratio_*` see the same ratio.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from avalon import sharding
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params, param_shardings

DECODE_DTYPE = jnp.bfloat16


def decode_dtypes(cfg: ModelConfig, dtype=DECODE_DTYPE) -> dict:
    """The dtype of each decode-view leaf: `dtype` for float matrices, the master's otherwise."""
    def one(a):
        return jnp.dtype(dtype) if a.ndim >= 2 and jnp.issubdtype(a.dtype, jnp.floating) \
            else a.dtype
    return jax.tree.map(one, abstract_params(cfg))


def _cast(params, dtypes):
    return jax.tree.map(lambda a, d: a.astype(d), params, dtypes)


class DecodeView:
    """`view(params)` -> the engine's params: cast, and re-laid out when a mesh is given.

    One jitted program (compiled on first use). The master is not donated: it stays the
    trainer's. With `dtype` the master's own and no mesh there is nothing to do (`casts` is
    False): the view is the master's arrays themselves, no copy. `last_seconds` is the wall
    time of the last call (blocked until ready)."""

    def __init__(self, cfg: ModelConfig, mesh: Mesh | None = None, dtype=DECODE_DTYPE):
        self.cfg = cfg
        self.dtype = jnp.dtype(dtype)
        self.dtypes = decode_dtypes(cfg, dtype)
        self.casts = any(a.dtype != d for a, d in zip(jax.tree.leaves(abstract_params(cfg)),
                                                      jax.tree.leaves(self.dtypes)))
        self.identity = mesh is None and not self.casts
        out = None if mesh is None else param_shardings(cfg, mesh, sharding.DECODE_RULES)
        self._fn = jax.jit(lambda p: _cast(p, self.dtypes), out_shardings=out)
        self.last_seconds = 0.0

    def __call__(self, params: dict) -> dict:
        t0 = time.perf_counter()
        view = params if self.identity else jax.block_until_ready(self._fn(params))
        self.last_seconds = time.perf_counter() - t0
        return view

    def nbytes(self) -> int:
        """Bytes of the view (what the switch writes unless it is the master itself; it reads
        the master's fp32 bytes)."""
        shapes = abstract_params(self.cfg)
        return int(sum(np.prod(a.shape) * jnp.dtype(d).itemsize
                       for a, d in zip(jax.tree.leaves(shapes), jax.tree.leaves(self.dtypes))))


def mismatch_stats(sampler_logprobs, trainer_logprobs, mask) -> dict:
    """Sampler-vs-trainer agreement over the masked tokens ([...] arrays, host or device).

    ratio = pi_trainer / pi_sampler per token. Reports its mean, min, max, the share of tokens
    with ratio outside [0.8, 1.25], the mean |log ratio|, and the k3 estimate of
    KL(sampler || trainer) = E[ratio - 1 - log ratio] (non-negative, unbiased)."""
    s = np.asarray(sampler_logprobs, np.float64)
    t = np.asarray(trainer_logprobs, np.float64)
    m = np.asarray(mask, bool)
    if not m.any():
        return {}
    log_ratio = (t - s)[m]
    ratio = np.exp(log_ratio)
    return {"ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "ratio_outside_frac": float(np.mean((ratio < 0.8) | (ratio > 1.25))),
            "abs_log_ratio_mean": float(np.abs(log_ratio).mean()),
            "kl_k3": float(np.mean(ratio - 1.0 - log_ratio))}


def abstract_decode_view(cfg: ModelConfig, mesh: Mesh | None = None, dtype=DECODE_DTYPE):
    """The decode view as ShapeDtypeStructs (with DECODE_RULES shardings under `mesh`): the
    params argument for lowering the decode step ahead of time."""
    shapes, dtypes = abstract_params(cfg), decode_dtypes(cfg, dtype)
    if mesh is None:
        return jax.tree.map(lambda a, d: jax.ShapeDtypeStruct(a.shape, d), shapes, dtypes)
    shard = param_shardings(cfg, mesh, sharding.DECODE_RULES)
    return jax.tree.map(lambda a, d, s: jax.ShapeDtypeStruct(a.shape, d, sharding=s), shapes,
                        dtypes, shard)
