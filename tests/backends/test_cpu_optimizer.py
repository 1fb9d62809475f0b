"""The update step's optimizer on CPU (`backends/cpu_optimizer.py`) against optax: the global
norm against `optax.tree.norm`; one pass of clip + AdamW against `make_optimizer`'s
`update` + `apply_updates` over several steps, clipping and not, with frozen leaves (no moments,
params untouched), a skipped step (state bit for bit as it came) and non-float32 leaves; the
update step with it against the step on optax. (The skip guard's own tests, tests/rl/
test_update.py, run on it too: their steps are one-device CPU steps.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from avalon import model as M
from avalon.backends import cpu_optimizer
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.update import make_optimizer, make_update_step
from tests.backends.helpers import assert_steps_agree, sft_batch


@pytest.fixture(autouse=True)
def kernel(cpu_optimizer_kernel):
    """Every test here needs the kernel (tests/conftest.py: fail in CI, skip without c++)."""


def _params_and_grads(seed, scale=1.0):
    cfg = M.presets.get("tiny", pattern="E*")  # MoE: a frozen router and router bias
    params = M.init_params(jax.random.key(seed), cfg)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    grads = tree.unflatten([scale * jax.random.normal(k, x.shape, x.dtype)
                            for k, x in zip(keys, leaves)])
    return params, grads


def test_global_norm_equals_optax():
    _, grads = _params_and_grads(0)
    grads = dict(grads, extra_bf16=jnp.ones((7, 3), jnp.bfloat16), empty=jnp.zeros((0, 4)))
    got = jax.jit(cpu_optimizer.global_norm)(grads)
    np.testing.assert_allclose(got, optax.tree.norm(grads), rtol=1e-6)


@pytest.mark.parametrize("clip_scale", [0.001, 100.0])  # under and over the clip norm
def test_adamw_pass_equals_optax_over_three_steps(clip_scale):
    rl = RLConfig(lr=1e-3, weight_decay=0.1, clip_norm=1.0)
    opt = make_optimizer(rl)
    params, _ = _params_and_grads(0)
    ref_params, ref_state = params, opt.init(params)
    got_params, got_state = params, opt.init(params)
    fused = jax.jit(lambda g, s, p, n: cpu_optimizer.adamw_update(rl, g, s, p, n, n > -1))
    for i in range(3):
        _, grads = _params_and_grads(10 + i, clip_scale)
        grads = jax.tree.map(lambda g, f: jnp.zeros_like(g) if f else g, grads,
                             _frozen(params, rl))  # a frozen leaf's gradient is zero
        updates, ref_state = opt.update(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
        got_params, got_state = fused(grads, got_state, got_params, optax.tree.norm(grads))
    assert jax.tree.structure(got_state) == jax.tree.structure(ref_state)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref_state),
                            jax.tree.leaves(got_state)):
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref_params),
                            jax.tree.leaves(got_params)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    frozen = jax.tree.leaves(jax.tree.map(lambda p, f: f, params, _frozen(params, rl)))
    for f, a, b in zip(frozen, jax.tree.leaves(params), jax.tree.leaves(got_params)):
        if f:
            np.testing.assert_array_equal(a, b)


def _frozen(params, rl):
    from avalon.rl.update import frozen_mask

    return frozen_mask(params, rl)


def test_a_skipped_step_leaves_the_state_as_it_came():
    rl = RLConfig(lr=1e-3)
    opt = make_optimizer(rl)
    params, grads = _params_and_grads(0)
    state = opt.init(params)
    state = jax.tree.map(lambda x: x + 0.5 if x.dtype == jnp.float32 else x, state)
    new_params, new_state = jax.jit(
        lambda g, s, p: cpu_optimizer.adamw_update(rl, g, s, p, jnp.float32(1.0),
                                                   jnp.bool_(False)))(grads, state, params)
    for a, b in zip(jax.tree.leaves((params, state)), jax.tree.leaves((new_params, new_state))):
        np.testing.assert_array_equal(a, b)


def test_non_float32_leaves_take_the_same_formula():
    rl = RLConfig(lr=1e-3, weight_decay=0.1)
    opt = make_optimizer(rl)
    params = {"w": jnp.linspace(-1, 1, 40).reshape(8, 5), "h": jnp.ones((6,), jnp.bfloat16)}
    grads = {"w": jnp.full((8, 5), 0.3), "h": jnp.full((6,), 0.2, jnp.bfloat16)}
    state = opt.init(params)
    updates, ref_state = opt.update(grads, state, params)
    ref = optax.apply_updates(params, updates)
    got, got_state = cpu_optimizer.adamw_update(rl, grads, state, params,
                                                optax.tree.norm(grads), jnp.bool_(True))
    np.testing.assert_allclose(got["w"], ref["w"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got["h"], np.float32), np.asarray(ref["h"], np.float32),
                               rtol=1e-2)


def test_update_step_on_the_kernel_equals_the_step_on_optax():
    cfg = M.presets.get("tiny", pattern="*E")
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32, clip_norm=0.5)
    params = M.init_params(jax.random.key(0), cfg)
    fast = make_update_step(cfg, rl)
    assert fast.platform.optimizer is cpu_optimizer
    plain = make_update_step(cfg, rl, platform=dataclasses.replace(fast.platform, optimizer=None))
    assert_steps_agree(fast, plain, params, sft_batch(cfg))
