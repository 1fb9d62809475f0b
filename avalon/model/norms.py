"""RMS norms as HF NemotronH computes them (fp32 inside, result cast to the input dtype)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon.model.ops import PLAIN, Ops


def rms_norm(x: jax.Array, w: jax.Array, eps: float, ops: Ops = PLAIN) -> jax.Array:
    """`NemotronHRMSNorm`: w * x * rsqrt(mean(x^2) + eps), weight multiply in fp32, then cast.
    On the platform's kernel where one is given for these arrays (`Ops.rms_norm`)."""
    fn = ops.fp32_kernel("rms_norm", x, w)
    if fn is not None:
        return fn(x, w, eps)
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (w.astype(jnp.float32) * xf).astype(x.dtype)


def gated_group_rms_norm(y: jax.Array, z: jax.Array, w: jax.Array, groups: int,
                         eps: float) -> jax.Array:
    """`NemotronHRMSNormGated` (norm_before_gate=False): u = y * silu(z), then RMS-normalise each
    of `groups` contiguous channel groups. y, z [b, t, H, P]; w [H, P]. Returns fp32; the caller
    casts (HF feeds this norm the fp32 scan output, so its weight multiply is fp32 too)."""
    b, t, h, p = y.shape
    u = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    u = u.reshape(b, t, groups, (h // groups) * p)
    u = u * jax.lax.rsqrt(jnp.mean(u * u, axis=-1, keepdims=True) + eps)
    return u.reshape(b, t, h, p) * w.astype(jnp.float32)
