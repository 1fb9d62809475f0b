"""Token log-probs and entropies from logits on CPU: a C++ kernel (forward and backward) behind
XLA's FFI, for the update step's LM head (`rl.logprobs`).

`rl.logprobs.log_softmax_stats` computes, per row of logits, log-sum-exp, the target's log-prob
and the entropy with XLA's reductions, which XLA:CPU runs as trees of reduce-window passes (~0.5
s of SmolLM2-135M's update step on one core; `docs/results_history.md`, "Where SmolLM2's update
step goes").
`cpu_log_softmax.cc` reads each row twice in the forward and once in the backward, in L2. Same
function and gradient (the target's log-prob only; the entropy carries none), equal to
rounding: tests/backends/test_cpu_log_softmax.py. fp32 logits; the update step uses it on a
CPU with one device (`training.TrainingPlatform.log_softmax`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from avalon.backends import cpu_build

SOURCE = Path(__file__).with_suffix(".cc")
FORWARD_TARGET = "avalon_logprobs_fwd"
BACKWARD_TARGET = "avalon_logprobs_bwd"
_SYMBOLS = {FORWARD_TARGET: "AvalonLogprobsForward", BACKWARD_TARGET: "AvalonLogprobsBackward"}


def log_softmax_stats(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """logits [..., V], targets [...] -> (log-prob of each target, entropy of each row), fp32:
    `rl.logprobs.log_softmax_stats` on the kernel (`ready()` must be True). The entropy carries
    no gradient."""
    lead, v = logits.shape[:-1], logits.shape[-1]
    if targets.shape != lead:
        raise ValueError(f"cpu_log_softmax: targets {targets.shape} do not match logits "
                         f"{logits.shape}")
    logp, entropy = _stats(logits.reshape(-1, v).astype(jnp.float32),
                           targets.reshape(-1).astype(jnp.int32))
    return logp.reshape(lead), jax.lax.stop_gradient(entropy).reshape(lead)


def _forward(logits, targets):
    n = jax.ShapeDtypeStruct(logits.shape[:1], jnp.float32)
    return jax.ffi.ffi_call(FORWARD_TARGET, (n, n, n), vmap_method="sequential")(logits, targets)


@jax.custom_vjp
def _stats(logits, targets):
    logp, entropy, _ = _forward(logits, targets)
    return logp, entropy


def _stats_fwd(logits, targets):
    logp, entropy, lse = _forward(logits, targets)
    return (logp, entropy), (logits, targets, lse)


def _stats_bwd(res, cotangents):
    logits, targets, lse = res
    g_logp, _ = cotangents  # the entropy is a diagnostic: no gradient
    dlogits = jax.ffi.ffi_call(BACKWARD_TARGET, jax.ShapeDtypeStruct(logits.shape, jnp.float32),
                               vmap_method="sequential")(logits, targets, lse,
                                                          g_logp.astype(jnp.float32))
    return dlogits, None


_stats.defvjp(_stats_fwd, _stats_bwd)


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel; True when the update step can use it.
    On a failure, one warning and False: the update step then keeps XLA's reductions."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "log-prob", "the update step uses XLA's reductions")
