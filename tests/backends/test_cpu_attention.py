"""The update step's CPU attention kernel (`backends/cpu_attention.py`) against the model's own
attention: the output and all three gradients equal to `_flash_core`'s (the custom-VJP block
attention XLA runs otherwise) and the output to the naive softmax reference, over causal rows,
several segments, padding, rows that end in partial query and key blocks, grouped query heads
and every head width class; the model through `Ops.attention`; the update step picking
it on one CPU device and its step equal to the step without it; and where it does not apply (the
fallback when no compiler can build it: test_cpu_build.py).

`.ci/run` sets AVALON_REQUIRE_CPU_KERNEL=1, so in CI a kernel that does not build fails these
tests; elsewhere (a machine without a C++ compiler) they skip."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.backends import cpu_attention
from avalon.backends.training import TrainingPlatform
from avalon.model import attention
from avalon.model.config import AttentionImpl
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.update import make_update_step
from avalon.sharding import make_mesh
from tests.backends.helpers import assert_steps_agree, sft_batch


@pytest.fixture(autouse=True)
def kernel(cpu_attention_kernel):
    """Every test here needs the kernel (tests/conftest.py: fail in CI, skip without c++)."""


def _segments(b, t, kind):
    if kind == "one":
        return np.ones((b, t), np.int32)
    seg = np.ones((b, t), np.int32)
    for i in range(b):  # packed rows: three documents, then padding (segment 0)
        a, c = t // 3 + i, 2 * t // 3 + 5
        seg[i, a:] = 2
        seg[i, c:] = 3
        seg[i, t - 7 - i:] = 0
    return seg


def _inputs(b, t, h, g, d, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, h, t * g, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, h, t, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, h, t, d)), jnp.float32)
    dout = jnp.asarray(rng.normal(size=(b, h, t * g, d)), jnp.float32)
    return q, k, v, dout


@pytest.mark.parametrize("b,t,h,g,d,segs", [
    (1, 1024, 3, 3, 64, "one"),       # SmolLM2's attention at the benchmark's row
    (2, 100, 2, 3, 32, "packed"),     # partial query (32) and key (64) blocks, segments, padding
    (1, 257, 1, 1, 16, "packed"),     # one query head per kv head
    (2, 70, 2, 2, 128, "one"),        # wide heads (3-row tiles)
    (1, 5, 1, 4, 48, "packed"),       # fewer keys than one block
])
def test_output_and_gradients_equal_the_models_flash_attention(b, t, h, g, d, segs):
    q, k, v, dout = _inputs(b, t, h, g, d)
    seg = jnp.asarray(_segments(b, t, segs))
    scale = d ** -0.5

    def ours(q, k, v):
        return cpu_attention.attention_core(q, k, v, seg, scale, g)

    def theirs(q, k, v):
        return attention._flash_core(q, k, v, seg, scale, g, attention.FLASH_BLOCK)

    out, vjp = jax.vjp(jax.jit(ours), q, k, v)
    ref, ref_vjp = jax.vjp(jax.jit(theirs), q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6)
    for name, got, want in zip("qkv", vjp(dout), ref_vjp(dout)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"d{name}")


def test_output_equals_the_naive_softmax_in_float64():
    """Against the plain formula (every score materialised, float64), not only the model's
    block attention."""
    b, t, h, g, d = 2, 90, 2, 3, 32
    q, k, v, _ = _inputs(b, t, h, g, d, seed=1)
    seg = _segments(b, t, "packed")
    out = np.asarray(cpu_attention.attention_core(q, k, v, jnp.asarray(seg), d ** -0.5, g))
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    query = np.arange(t * g) // g
    for i in range(b):
        seen = (query[:, None] >= np.arange(t)[None, :]) \
            & (seg[i][query][:, None] == seg[i][None, :])
        for j in range(h):
            s = np.where(seen, q64[i, j] @ k64[i, j].T * d ** -0.5, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            want = (p / p.sum(axis=1, keepdims=True)) @ v64[i, j]
            np.testing.assert_allclose(out[i, j], want, rtol=1e-5, atol=1e-6)


def test_model_attention_through_the_kernel_equals_flash():
    """FLASH in the model on the kernel (`Ops.attention`: projections, RoPE, grouped heads, the
    layout changes around the core) against FLASH's own blocks, value and gradient, on a packed
    row."""
    cfg = M.presets.get("tiny", pattern="*", attention_impl=AttentionImpl.FLASH,
                        rope_theta=10000.0)
    layer = jax.tree.map(lambda a: a[0], M.init_params(jax.random.key(0), cfg)["blocks"][0])
    layer = layer["0_attention"]
    x = jax.random.normal(jax.random.key(1), (2, 40, cfg.hidden_size))
    seg = jnp.asarray(_segments(2, 40, "packed"))

    def run(ops):
        def f(x):
            y, _ = attention.attention(layer, x, cfg, segment_ids=seg, ops=ops)
            return jnp.sum(y * jnp.cos(x)), y
        (_, y), dx = jax.jit(jax.value_and_grad(f, has_aux=True))(x)
        return y, dx

    y, dx = run(M.Ops(attention=cpu_attention.attention_core))
    y_ref, dx_ref = run(M.PLAIN)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-6)


def test_update_step_on_one_cpu_uses_the_kernel_and_equals_the_models_step():
    """make_update_step on one CPU device runs FLASH attention on the kernel; one SFT step
    moves the params as the step with the model's own attention does."""
    cfg = M.presets.get("tiny", pattern="*-", attention_impl=AttentionImpl.FLASH)
    rl = RLConfig(loss=LossKind.SFT, lr=1e-3, adam_eps=1e-5, logprob_chunk=32)
    fused = make_update_step(cfg, rl)
    assert fused.platform.ops.attention is cpu_attention.attention_core
    own = TrainingPlatform.for_mesh(None, cfg)
    own = dataclasses.replace(own, ops=dataclasses.replace(own.ops, attention=None))
    plain = make_update_step(cfg, rl, platform=own)
    assert_steps_agree(fused, plain, M.init_params(jax.random.key(0), cfg), sft_batch(cfg))


def test_where_the_kernel_does_not_apply_the_model_keeps_its_own():
    flash = M.presets.get("tiny", attention_impl=AttentionImpl.FLASH)
    core = cpu_attention.attention_core
    assert TrainingPlatform.for_mesh(None, flash).ops.attention is core
    # bf16 activations, a head width without a product, another attention, several devices.
    for cfg in (flash.replace(dtype="bfloat16"), flash.replace(head_dim=24),
                flash.replace(attention_impl=AttentionImpl.NAIVE)):
        assert TrainingPlatform.for_mesh(None, cfg).ops.attention is None
    mesh = make_mesh({"data": 8})
    assert TrainingPlatform.for_mesh(mesh, flash).ops.attention is None
