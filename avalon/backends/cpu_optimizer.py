"""The update step's gradient norm, clip and AdamW on CPU in one pass per parameter: a C++
kernel behind XLA's FFI (`cpu_optimizer.cc`).

XLA:CPU runs `optax.clip_by_global_norm` + `optax.adamw` + the step's skip guard as several passes
over every parameter, and the global norm's sums of squares at ~1.3 GB/s, twice (the metric, the
clip): ~0.75 s of SmolLM2-135M's 8.7 s update step on one core (the profile in
`docs/results_history.md`, SmolLM2's update step with products on MKL). Here the norm reads each
gradient once, and one pass per leaf reads g, p, mu, nu and writes p, mu, nu in place. The optimizer
state stays optax's (the one `rl.update.make_optimizer` builds: checkpoints are the same), and the
results equal optax's to rounding (tests/backends/test_cpu_optimizer.py). float32 leaves; others
take the same formula in jnp. Used on a CPU with one device (`training.TrainingPlatform.optimizer`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

from avalon.backends import cpu_build

SOURCE = Path(__file__).with_suffix(".cc")
SUM_SQUARES_TARGET = "avalon_sum_squares"
ADAMW_TARGET = "avalon_adamw"
_SYMBOLS = {SUM_SQUARES_TARGET: "AvalonSumSquares", ADAMW_TARGET: "AvalonAdamw"}


@functools.cache
def ready() -> bool:
    """Build (once per machine) and register the kernel; True when the update step can use it."""
    return cpu_build.ready(SOURCE, _SYMBOLS, "optimizer", "the update step uses optax's passes")


def global_norm(tree) -> jax.Array:
    """sqrt(sum of every leaf's squares), float32: `optax.tree.norm`'s value, each float32 leaf
    read once by the kernel."""
    total = jnp.zeros((), jnp.float32)
    for leaf in jax.tree.leaves(tree):
        if leaf.dtype == jnp.float32 and leaf.size:
            total = total + jax.ffi.ffi_call(SUM_SQUARES_TARGET,
                                             jax.ShapeDtypeStruct((), jnp.float32))(leaf)
        else:
            total = total + jnp.sum(jnp.square(leaf.astype(jnp.float32)))
    return jnp.sqrt(total)


def _is_adam(x) -> bool:
    return isinstance(x, optax.ScaleByAdamState)


def _adamw_leaf(p, g, mu, nu, scalars):
    if p.dtype == g.dtype == mu.dtype == nu.dtype == jnp.float32:
        out = jax.ShapeDtypeStruct(p.shape, jnp.float32)
        return jax.ffi.ffi_call(ADAMW_TARGET, (out, out, out),
                                input_output_aliases={0: 0, 2: 1, 3: 2})(p, g, mu, nu, scalars)
    # The kernel's formula in jnp for other dtypes.
    norm, max_norm, b1, b2, eps, eps_root, decay, lr, bc1, bc2, ok = scalars
    gc = jnp.where((max_norm > 0) & ~(norm < max_norm), g / norm * max_norm, g)
    m = (1 - b1) * gc + b1 * mu
    v = (1 - b2) * (gc * gc) + b2 * nu
    u = (m / bc1) / (jnp.sqrt(v / bc2 + eps_root) + eps) + decay * p
    keep = ok == 0
    return (jnp.where(keep, p, (p + u * -lr).astype(p.dtype)),
            jnp.where(keep, mu, m.astype(mu.dtype)), jnp.where(keep, nu, v.astype(nu.dtype)))


def adamw_update(rl_cfg, grads, opt_state, params, grad_norm, ok):
    """(new params, new opt_state) of `make_optimizer(rl_cfg)` applied to grads, or the old
    ones where `ok` is False (the step's guard), in one pass per trainable leaf. grad_norm is
    the gradients' global norm (the clip's; frozen leaves' gradients are zero). Frozen leaves
    (no moments in the state: optax's MaskedNode) keep their params."""
    adams = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_adam) if _is_adam(x)]
    if len(adams) != 1:
        raise ValueError("cpu_optimizer.adamw_update: the optimizer state holds "
                         f"{len(adams)} Adam states, not make_optimizer's one")
    adam = adams[0]
    count = optax.safe_increment(adam.count)
    f32 = jnp.float32
    scalars = jnp.stack([
        grad_norm.astype(f32), jnp.asarray(rl_cfg.clip_norm, f32), jnp.asarray(rl_cfg.b1, f32),
        jnp.asarray(rl_cfg.b2, f32), jnp.asarray(rl_cfg.adam_eps, f32), jnp.zeros((), f32),
        jnp.asarray(rl_cfg.weight_decay, f32), jnp.asarray(rl_cfg.lr, f32),
        (1 - rl_cfg.b1 ** count).astype(f32), (1 - rl_cfg.b2 ** count).astype(f32),
        ok.astype(f32)])
    flat_p, tree = jax.tree.flatten(params)
    flat_g = tree.flatten_up_to(grads)
    is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    flat_mu, flat_nu = tree.flatten_up_to(adam.mu), tree.flatten_up_to(adam.nu)
    new_p, new_mu, new_nu = [], [], []
    for p, g, mu, nu in zip(flat_p, flat_g, flat_mu, flat_nu):
        if is_masked(mu):  # frozen: no update, no moments
            new_p.append(p)
            new_mu.append(mu)
            new_nu.append(nu)
            continue
        p2, mu2, nu2 = _adamw_leaf(p, g, mu, nu, scalars)
        new_p.append(p2)
        new_mu.append(mu2)
        new_nu.append(nu2)
    new_adam = adam._replace(count=jnp.where(ok, count, adam.count),
                             mu=tree.unflatten(new_mu), nu=tree.unflatten(new_nu))
    new_state = jax.tree.map(lambda x: new_adam if _is_adam(x) else x, opt_state,
                             is_leaf=_is_adam)
    return tree.unflatten(new_p), new_state
