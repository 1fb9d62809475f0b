"""The feed-forward activations, one place for the forward and the gradient the MoE backends'
custom VJPs need.

Routed experts keep one "up" weight per expert, so every dispatch backend runs the same two
products (up, then down). Under SWIGLU that up weight is the gate and up projections side by
side, [w, 2f] (gate columns first, as transformers' fused `gate_up_proj` rows), and the
activation reads both halves of the pre-activation:

    RELU2   h = relu(p)^2                     dh/dp = 2 relu(p)
    SWIGLU  h = silu(p[:f]) * p[f:]           d/dp[:f] = g * p[f:] * silu'(p[:f]),
                                              d/dp[f:] = g * silu(p[:f])
with silu'(a) = s(a) (1 + a (1 - s(a))), s the logistic sigmoid.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from avalon.model.config import Activation


def relu2(x):
    return jnp.square(jax.nn.relu(x))


def activate(act: Activation, pre: jax.Array) -> jax.Array:
    """pre [..., f] (RELU2) or [..., 2f] (SWIGLU: gate | up) -> h [..., f]."""
    if act == Activation.RELU2:
        return relu2(pre)
    f = pre.shape[-1] // 2
    return jax.nn.silu(pre[..., :f]) * pre[..., f:]


def activate_grad(act: Activation, pre: jax.Array, g: jax.Array) -> jax.Array:
    """The cotangent of `pre` given the cotangent `g` [..., f] of `activate(act, pre)`."""
    if act == Activation.RELU2:
        return g * (2 * jax.nn.relu(pre))
    f = pre.shape[-1] // 2
    a, u = pre[..., :f], pre[..., f:]
    s = jax.nn.sigmoid(a)
    d_silu = s * (1 + a * (1 - s))
    return jnp.concatenate([g * u * d_silu, g * (a * s)], axis=-1)


def up_width(act: Activation, f: int) -> int:
    """Columns of the (fused) up weight for an intermediate width f."""
    return 2 * f if act == Activation.SWIGLU else f
