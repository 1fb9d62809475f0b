"""The Mamba-2 mixer (`M` layers), exactly as transformers 5.24 `NemotronHMamba2Mixer` computes it.

    z, xBC, dt = in_proj(x)                 (split z / x,B,C / dt; stored as separate weights)
    xBC = silu(causal_depthwise_conv(xBC))  (window K, with a conv state of the last K-1 inputs)
    A = -exp(A_log); dt = softplus(dt + dt_bias), clamped below at time_step_min on the chunked
        path (HF 5.24 clamps in its chunk scan but not in its one-token decode step; set
        `decode_dt_clamp` to clamp there too, so decode equals the full forward exactly)
    y = SSD(x, dt, A, B, C) + D x           (fp32; chunked for t > 1, recurrent for t == 1)
    y = gated_group_rmsnorm(y * silu(z))    (fp32, G groups of I/G channels)
    out = out_proj(y)

Contract shared by the sequence mixers: `mamba_mixer(p, x, cfg, segment_ids=, cache=, num_new=)`
-> (y, new_cache). `x` [b, t, D] is the layer's normed input. Without a cache it is a full
(training / packed) forward and returns no cache. With a cache (`MambaCache`) it continues from
it; `num_new` [b] says how many of the t positions of each row are real (the rest is right
padding that leaves the state untouched), which is how the engine extends many slots at once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from avalon import sharding
from avalon.model.config import ModelConfig
from avalon.model.dense import BackendWeight, dense
from avalon.model.norms import gated_group_rms_norm
from avalon.model.ops import PLAIN, Ops
from avalon.model.ssd import ssd_chunked, ssd_step
from avalon.sharding import constrain


@struct.dataclass
class MambaCache:
    """Per-slot Mamba state: the last K-1 pre-conv inputs and the SSM state (fp32)."""

    conv_x: jax.Array  # [b, K-1, H, P]
    conv_B: jax.Array  # [b, K-1, G, N]
    conv_C: jax.Array  # [b, K-1, G, N]
    ssm: jax.Array  # [b, H, P, N], cfg.ssm_state_dtype


def init_mamba_cache(cfg: ModelConfig, batch: int) -> MambaCache:
    k1, h, p, g, n = (cfg.conv_kernel - 1, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups,
                      cfg.ssm_state_size)
    dt = cfg.jnp_dtype
    return MambaCache(
        conv_x=jnp.zeros((batch, k1, h, p), dt), conv_B=jnp.zeros((batch, k1, g, n), dt),
        conv_C=jnp.zeros((batch, k1, g, n), dt),
        ssm=jnp.zeros((batch, h, p, n), jnp.dtype(cfg.ssm_state_dtype)))


MAMBA_CACHE_AXES = MambaCache(
    conv_x=("batch", None, "act_mamba_heads", None), conv_B=("batch", None, None, None),
    conv_C=("batch", None, None, None), ssm=("batch", "act_mamba_heads", None, None))


def _proj(x, w, bias=None, ops: Ops = PLAIN):
    """x [b, t, D] @ w [D, ...] -> [b, t, ...]."""
    y = dense(x, w, ops=ops)
    return y if bias is None else y + bias.astype(y.dtype)


_IN = ("z", "x", "B", "C", "dt")


def _in_proj(x, p: dict, *, merged: bool, ops: Ops = PLAIN):
    """The five input projections. `merged` (the full-sequence path) and without a mesh they
    run as one matmul against the concatenated weights (as HF's single in_proj): on CPU the
    narrow B, C and dt products (widths G*N and H) are far below matmul efficiency on their
    own, and the input gradient becomes one product instead of five. Under a mesh each keeps
    its own sharding; with a cache (decode) the weights are read in place, not concatenated
    again at every token."""
    # Weights in a backend's layout (the engine's, `avalon/backends/`) are read in place, one
    # product each.
    if not merged or sharding.active_mesh() is not None or isinstance(p["in_z"], BackendWeight):
        return tuple(_proj(x, p[f"in_{n}"], p.get(f"in_bias_{n}"), ops) for n in _IN)
    ws = [p[f"in_{n}"] for n in _IN]
    flat = jnp.concatenate([w.reshape(w.shape[0], -1) for w in ws], axis=1).astype(x.dtype)
    y = dense(x, flat, ops=ops)
    # One split (its gradient is one concatenate; five slices' gradients were five padded
    # copies of the whole [tokens, width] gradient, summed).
    parts = jax.lax.split(y, [math.prod(w.shape[1:]) for w in ws], axis=-1)
    out = []
    for n, w, part in zip(_IN, ws, parts):
        part = part.reshape(*x.shape[:-1], *w.shape[1:])
        bias = p.get(f"in_bias_{n}")
        out.append(part if bias is None else part + bias.astype(part.dtype))
    return tuple(out)


def _at_residual_split(z, xs, Bs, Cs, dt):
    """The projections' outputs laid out like the residual stream (under sequence parallelism:
    each chip's positions, every head), before the constraints that switch them to whole rows
    with a share of the heads. So the switch is an all-to-all of these outputs, and the
    projections (and their input gradients) run on a chip's own positions; without it the
    partitioner all-gathers the layer input to whole rows first, and the backward builds whole
    -row [b, t, D] input gradients (the pod: 1 GB each; docs/results_history.md, "The pod's update
    step: capacity 1.1, the all-to-all switch, the blocked Mamba core"). A
    no-op without sequence parallelism ("act_seq" unsplit)."""
    heads = ("batch", "act_seq", "act_mixer_out", None)
    return (constrain(z, heads), constrain(xs, heads),
            constrain(Bs, ("batch", "act_seq", None, None)),
            constrain(Cs, ("batch", "act_seq", None, None)),
            constrain(dt, ("batch", "act_seq", "act_mixer_out")))


def causal_conv(u, state, w, bias, segment_ids=None, *, cached: bool = False):
    """Depthwise causal conv along time. u [b, t, *c]; state [b, K-1, *c] (the inputs before u);
    w [K, *c] with w[K-1] on the current token. Positions of another segment contribute zero.

    cached: `state` is a cache entry that the next state overwrites in place. [state, u] is
    then materialised once and both the taps and the next state read it; otherwise XLA reads
    the old state in the tap fusions after the in-place write, and copies it every step."""
    k = w.shape[0]
    t = u.shape[1]
    padded = jnp.concatenate([state.astype(u.dtype), u], axis=1)  # [b, K-1+t, *c]
    if cached:
        padded = jax.lax.optimization_barrier(padded)
    out = jnp.zeros(u.shape, jnp.float32)
    for i in range(k):
        # Token at time s reads input s - (K-1-i), which sits at padded index s + i.
        tap = padded[:, i:i + t].astype(jnp.float32)
        if segment_ids is not None:
            lag = k - 1 - i
            src = jnp.pad(segment_ids, [(0, 0), (lag, 0)], constant_values=-1)[:, :t]
            tap = tap * (src == segment_ids).reshape(*src.shape, *([1] * (u.ndim - 2)))
        out = out + tap * w[i].astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(u.dtype), padded


def _next_conv_state(padded, k1: int, num_new):
    """The last K-1 real inputs of [state, new]: rows advance by their own num_new."""
    if num_new is None:
        return padded[:, padded.shape[1] - k1:]
    idx = num_new[:, None] + jnp.arange(k1)[None, :]  # [b, K-1] into padded
    idx = idx.reshape(*idx.shape, *([1] * (padded.ndim - 2)))
    return jnp.take_along_axis(padded, idx, axis=1)


def _conv_silu(p: dict, u, state, name: str, segment_ids, *, cached: bool = False):
    """SiLU(causal_conv(u)) in u's dtype (the conv's activation runs in fp32), and the padded
    input `causal_conv` returns for the next conv state. name: "x", "B" or "C"."""
    o, padded = causal_conv(u, state, p[f"conv_{name}"], p.get(f"conv_bias_{name}"),
                            segment_ids, cached=cached)
    return jax.nn.silu(o.astype(jnp.float32)).astype(u.dtype), padded


def _softplus_dt(p: dict, dt):
    """The step sizes before any clamp: softplus(dt + dt_bias), fp32."""
    return jax.nn.softplus(dt.astype(jnp.float32) + p["dt_bias"].astype(jnp.float32))


def _out_proj(p: dict, y, *, training: bool, ops: Ops = PLAIN):
    """y [b, t, H, P] (the gated norm's output in the compute dtype) -> [b, t, D]."""
    if training:  # back to the residual stream's position split before out_proj
        y = constrain(y, ("batch", "act_seq", "act_mixer_out", None))
    out = dense(y, p["out"].astype(y.dtype), 2, ops)
    if "out_bias" in p:
        out = out + p["out_bias"].astype(y.dtype)
    return out


def mixer_core_blocked(p: dict, xs, Bs, Cs, dt, z, cfg: ModelConfig, segment_ids=None):
    """The training mixer between the input projections and out_proj (causal conv, SiLU,
    SSD, gated norm), `cfg.ssd_block` positions at a time: a `lax.scan` over blocks carrying
    the SSM state, each block recomputed in its backward (`ModelConfig.ssd_block`).
    xs, z [b, t, H, P], Bs, Cs [b, t, G, N], dt [b, t, H] as the projections give them
    (compute dtype) -> y [b, t, H, P] in that dtype; equal to the whole-row path.

    Why whole blocks and not only the SSD: on a whole 131K-token row every fp32 intermediate of the
    conv, the SSD and the gated norm is 1 GB per chip at the pod's 32 heads, and a Mamba layer's
    backward held a dozen of them (docs/results_history.md, "The pod's update step: capacity 1.1,
    the all-to-all switch, the blocked Mamba core"); here only the bf16 inputs and output are whole
    rows. The price is one more forward of a block's SSD in the backward (its matmuls: a few percent
    of the layer's FLOPs).

    The conv reads the K-1 positions before each block (its `halo`, with their segment ids:
    a tap from another segment contributes zero, as on the whole row). Packed segments and the
    carried state: `ssd_chunked` gives its initial state to the first segment of the block, so
    the carried state enters only when the block's first position continues the segment that
    ended the previous block; a segment that starts exactly at a block boundary starts from
    zero."""
    b, t = xs.shape[:2]
    block, k1, dtype = cfg.ssd_block, cfg.conv_kernel - 1, xs.dtype
    pad = (-t) % block  # padded positions come last: they cannot reach a real output
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def blocks(a, mode="constant"):  # [b, t, ...] -> [n, b, block, ...]
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2), mode=mode)
        return a.reshape(b, -1, block, *a.shape[2:]).swapaxes(0, 1)

    def halo(a, fill):  # [n, b, block, ...] -> the K-1 positions before each block
        first = jnp.full_like(a[:1, :, :k1], fill)
        return jnp.concatenate([first, a[:-1, :, block - k1:]], axis=0)

    xb, Bb, Cb, dtb, zb = blocks(xs), blocks(Bs), blocks(Cs), blocks(dt), blocks(z)
    sb = blocks(seg, mode="edge")
    ins = (xb, Bb, Cb, dtb, zb, sb, halo(xb, 0), halo(Bb, 0), halo(Cb, 0), halo(sb, -1))
    A = -jnp.exp(p["A_log"].astype(jnp.float32))
    D = p["D"].astype(jnp.float32)
    f32 = lambda a: a.astype(jnp.float32)

    def one(blk, h0):
        xk, Bk, Ck, dtk, zk, sk, hx, hB, hC, hs = blk
        ext = jnp.concatenate([hs, sk], axis=1)
        xc, Bc, Cc = (_conv_silu(p, jnp.concatenate([hu, u], axis=1), jnp.zeros_like(hu),
                                 name, ext)[0][:, k1:]
                      for u, hu, name in ((xk, hx, "x"), (Bk, hB, "B"), (Ck, hC, "C")))
        dtk = jnp.maximum(_softplus_dt(p, dtk), cfg.time_step_min)
        y, state = ssd_chunked(f32(xc), dtk, A, f32(Bc), f32(Cc), D, cfg.chunk_size, h0=h0,
                               segment_ids=sk)
        y = gated_group_rms_norm(y, zk, p["gate_norm"], cfg.n_groups, cfg.layer_norm_epsilon)
        return y.astype(dtype), state

    one = jax.checkpoint(one)

    def step(carry, blk):
        state, last = carry
        sk = blk[5]
        h0 = state * (sk[:, 0] == last).astype(state.dtype)[:, None, None, None]
        y, state = one(blk, h0)
        return (state, sk[:, -1]), y

    h, pdim, n = xs.shape[2], xs.shape[3], Bs.shape[3]
    init = (jnp.zeros((b, h, pdim, n), jnp.float32), seg[:, 0])
    _, ys = jax.lax.scan(step, init, ins)
    return ys.swapaxes(0, 1).reshape(b, -1, *xs.shape[2:])[:, :t]


def mamba_mixer(p: dict, x: jax.Array, cfg: ModelConfig, *, segment_ids=None,
                cache: MambaCache | None = None, num_new=None, ops: Ops = PLAIN):
    b, t, _ = x.shape
    dtype = x.dtype
    # z, xs [b, t, H, P]; Bs, Cs [b, t, G, N]; dt [b, t, H]
    z, xs, Bs, Cs, dt = _in_proj(x, p, merged=cache is None, ops=ops)
    if cache is None:
        z, xs, Bs, Cs, dt = _at_residual_split(z, xs, Bs, Cs, dt)
    xs = constrain(xs, ("batch", "mixer_seq", "act_mamba_heads", None))
    z = constrain(z, ("batch", "mixer_seq", "act_mamba_heads", None))
    if cache is None:
        # Whole rows, heads split (sequence parallelism: an all-to-all from the position split
        # of the residual stream; a no-op under the rules without it).
        Bs = constrain(Bs, ("batch", "mixer_seq", "act_mamba_groups", None))
        Cs = constrain(Cs, ("batch", "mixer_seq", "act_mamba_groups", None))
        dt = constrain(dt, ("batch", "mixer_seq", "act_mamba_heads"))

    if cache is None and cfg.ssd_block and t > cfg.ssd_block:
        y = mixer_core_blocked(p, xs, Bs, Cs, dt, z, cfg, segment_ids)
        return _out_proj(p, y, training=True, ops=ops), None

    k1 = cfg.conv_kernel - 1
    if cache is None:
        zeros = lambda a: jnp.zeros((b, k1, *a.shape[2:]), a.dtype)
        states = (zeros(xs), zeros(Bs), zeros(Cs))
    else:
        states = (cache.conv_x, cache.conv_B, cache.conv_C)
    conv_out, padded = zip(*(
        _conv_silu(p, u, st, name, segment_ids, cached=cache is not None)
        for u, st, name in ((xs, states[0], "x"), (Bs, states[1], "B"), (Cs, states[2], "C"))))
    xc, Bc, Cc = conv_out

    A = -jnp.exp(p["A_log"].astype(jnp.float32))
    dt = _softplus_dt(p, dt)
    D = p["D"].astype(jnp.float32)
    f32 = lambda a: a.astype(jnp.float32)
    state_dtype = jnp.dtype(cfg.ssm_state_dtype)

    if cache is not None and t == 1:
        # One-token decode: the recurrent step; HF 5.24's decode path does not clamp dt.
        if cfg.decode_dt_clamp:
            dt = jnp.maximum(dt, cfg.time_step_min)
        if num_new is not None:
            dt = dt * (num_new > 0)[:, None, None]
        y, ssm = ssd_step(f32(cache.ssm), f32(xc[:, 0]), dt[:, 0], A, f32(Bc[:, 0]),
                          f32(Cc[:, 0]), D)
        y = y[:, None]
    else:
        dt = jnp.maximum(dt, cfg.time_step_min)
        if num_new is not None:
            dt = dt * (jnp.arange(t)[None, :] < num_new[:, None])[..., None]
        h0 = None if cache is None else f32(cache.ssm)
        y, ssm = ssd_chunked(f32(xc), dt, A, f32(Bc), f32(Cc), D, cfg.chunk_size, h0=h0,
                             segment_ids=segment_ids)

    y = gated_group_rms_norm(y, z, p["gate_norm"], cfg.n_groups, cfg.layer_norm_epsilon)
    out = _out_proj(p, y.astype(dtype), training=cache is None, ops=ops)
    if cache is None:
        return out, None
    new_cache = MambaCache(
        conv_x=_next_conv_state(padded[0], k1, num_new).astype(cache.conv_x.dtype),
        conv_B=_next_conv_state(padded[1], k1, num_new).astype(cache.conv_B.dtype),
        conv_C=_next_conv_state(padded[2], k1, num_new).astype(cache.conv_C.dtype),
        ssm=ssm.astype(state_dtype))
    return out, new_cache
