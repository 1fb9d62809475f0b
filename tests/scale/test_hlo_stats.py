"""The compiled-HLO FLOP and collective counter, on CPU programs with hand-computed answers."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from avalon import sharding
from experiments.scale import hlo_stats


def _compiled(fn, *args, **jit_kw):
    return jax.jit(fn, **jit_kw).lower(*args).compile()


def test_loop_free_flops_match_cost_analysis_and_hand_count():
    a = jax.ShapeDtypeStruct((64, 96), jnp.float32)
    b = jax.ShapeDtypeStruct((96, 40), jnp.float32)
    c = _compiled(lambda a, b: jnp.tanh(a @ b), a, b)
    stats = hlo_stats.analyse(c.as_text())
    assert stats.flops == 2 * 64 * 96 * 40
    assert stats.loops == []


def test_scan_bodies_are_weighted_by_trip_count():
    """XLA's cost analysis counts a loop body once; the counter multiplies by its 7 trips."""
    w = jax.ShapeDtypeStruct((7, 32, 32), jnp.float32)
    x = jax.ShapeDtypeStruct((16, 32), jnp.float32)

    def f(w, x):
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]

    c = _compiled(f, w, x)
    stats = hlo_stats.analyse(c.as_text())
    assert stats.unknown_trip_loops == []
    assert stats.flops == 7 * 2 * 16 * 32 * 32
    # Nested loops multiply: 3 outer x 7 inner steps.
    def g(w, x):
        def outer(h, _):
            return f(w, h), None
        return jax.lax.scan(outer, x, None, length=3)[0]

    stats = hlo_stats.analyse(_compiled(g, w, x).as_text())
    assert stats.flops == 3 * 7 * 2 * 16 * 32 * 32


def test_collectives_by_kind_with_bytes():
    mesh = sharding.make_mesh({"fsdp": 8})
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    c = _compiled(lambda x: jnp.sum(x, axis=0), x,
                  in_shardings=NamedSharding(mesh, PartitionSpec("fsdp")),
                  out_shardings=NamedSharding(mesh, PartitionSpec()))
    coll = hlo_stats.analyse(c.as_text()).collectives
    assert coll["all-reduce"]["count"] == 1
    assert coll["all-reduce"]["bytes"] == 128 * 4  # the [128] fp32 partial sums


def test_shape_bytes():
    assert hlo_stats.shape_bytes("bf16[256,1024]{1,0:T(8,128)(2,1)}") == 256 * 1024 * 2
    assert hlo_stats.shape_bytes("(s32[], f32[2,3]{1,0}, u8[5])") == 4 + 24 + 5


def test_tpu_padding_window_convolution_counts_real_taps_only():
    """TPU's lowering of `btd,dhp->bthp` (from a v5p compile): a window of 48 that moves over
    a size-1 spatial input padded by 47 each side reads one real element per output."""
    text = """HloModule m

ENTRY %main (a: bf16[4096,1536,1], b: bf16[1536,48,64]) -> bf16[4096,48,64] {
  %a = bf16[4096,1536,1]{1,0,2} parameter(0)
  %b = bf16[1536,48,64]{0,2,1} parameter(1)
  ROOT %c = bf16[4096,48,64]{0,2,1} convolution(%a, %b), """ + \
        """window={size=48 pad=47_47 rhs_reversal=1}, dim_labels=bf0_i0o->b0f
}
"""
    assert hlo_stats.analyse(text).flops == 2 * 4096 * 1536 * 48 * 64


# An XLA-made loop (the shape of a windowed einsum unrolled twice): the condition compares the
# counter (tuple index 1) with 16, the body adds 2 to it, so 8 trips of one [8,16]x[16,4] dot.
_STEP_TWO = """HloModule m

%body (p: (f32[8,4], u32[])) -> (f32[8,4], u32[]) {
  %p = (f32[8,4], u32[]) parameter(0)
  %acc = f32[8,4] get-tuple-element(%p), index=0
  %i = u32[] get-tuple-element(%p), index=1
  %x = f32[8,16] constant({...})
  %w = f32[16,4] constant({...})
  %d = f32[8,4] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %s = f32[8,4] add(%acc, %d)
  %two = u32[] constant(2)
  %next = u32[] add(%i, %two)
  ROOT %t = (f32[8,4], u32[]) tuple(%s, %next)
}

%cond (q: (f32[8,4], u32[])) -> pred[] {
  %q = (f32[8,4], u32[]) parameter(0)
  %c = u32[] get-tuple-element(%q), index=1
  %limit = u32[] constant(16)
  ROOT %lt = pred[] compare(%c, %limit), direction=LT
}

ENTRY %main (a: f32[8,4]) -> (f32[8,4], u32[]) {
  %a = f32[8,4] parameter(0)
  %zero = u32[] constant(0)
  %init = (f32[8,4], u32[]) tuple(%a, %zero)
  ROOT %w = (f32[8,4], u32[]) while(%init), condition=%cond, body=%body
}
"""


def test_loop_whose_body_steps_its_counter_by_two_counts_half_the_bound():
    stats = hlo_stats.analyse(_STEP_TWO)
    assert stats.unknown_trip_loops == []
    assert stats.flops == 8 * 2 * 8 * 16 * 4
