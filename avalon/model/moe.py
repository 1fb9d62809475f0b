"""The MoE layer (`E`), as transformers 5.24 `NemotronHMoE` (and, with Router.SOFTMAX and
SWIGLU experts, `Qwen3MoeSparseMoeBlock`) computes it.

Router (fp32): s = sigmoid(x W_r). Selection uses s + correction_bias, group-limited (a group's
score is the sum of its top-2; the best `topk_group` groups stay, the rest are -inf), then top-k.
Gate weights use the *unbiased* s at the chosen experts, renormalised (+1e-20) when
`norm_topk_prob`, times `routed_scaling_factor`. Routed experts are non-gated squared-ReLU,
down(relu(up x_l)^2) (SWIGLU: down(silu(gate x_l) * up x_l), `activations.py`), on the
latent x_l = latent_in(x) when `moe_latent_size` is set; their weighted sum (fp32 accumulation) is
cast back and mapped by latent_out. A shared expert down(relu(up x)^2) on the full-width x is added
(none when its width is 0). Dropless: every choice is computed.

Router.SOFTMAX (Qwen3-MoE): p = softmax(x W_r) over all experts (fp32), top-k of p, gate weights
p at the chosen experts, renormalised when `norm_topk_prob`; no correction bias, no groups.

Routing replay: `moe_layer(..., routing=idx)` uses the given experts [b, t, k] instead of
selecting, and recomputes the gate weights from the live router (the R3 convention). The layer
always returns the experts it used. `cfg.router_frozen` stops gradients into the router weight
and bias (the optimizer mask of the RL step keeps them bit-identical too).

Dispatch backends (`cfg.moe_backend`), all equal to the dense reference:
  DENSE             every expert on every token, then masked; for tests and tiny models
  RAGGED_DOT        sort by expert, `lax.ragged_dot`. Never on GPU: it densifies there
                    (6 TFLOP/s vs 509 for a batched matmul on an H200); CPU lowers it to a dense
                    masked product too, and on TPU its weight gradient is a dense masked product
                    over the experts (compiled for v5p), so TPU uses MEGABLOX
  CAPACITY_BUCKETS  sort by expert, gather into [E, C, w] and run batched matmuls, with C the
                    smallest of a few static capacities that holds the busiest expert (chosen
                    on device by `lax.switch`, so nothing is dropped); a custom VJP moves the
                    gradients with gathers too (`_bucketed_experts`)
  GROUPED           sort by expert, pad each expert's rows to whole tiles (`group_tile`, <= 256
                    rows) and run the occupied tiles in a loop, each against its expert's
                    weights in place: padding under one tile per expert instead of every expert
                    padded to the busiest; custom VJP with gathers (`_grouped_experts`). A
                    CPU backend: the loop of 2-D products is what XLA:CPU runs fastest
  MEGABLOX          (expert-parallel path, TPU) the Pallas grouped matmul, gmm forward and
                    gmm/tgmm backward
  AUTO              the caller's platform's choice (`ops.Ops.moe_backend`; without one DENSE)

Expert weights held in a platform backend's decode layout (`model.dense.BackendWeight`, the
engine's on CPU: `avalon/backends/`) run GROUPED's forward on their own
(`BackendWeight.routed_experts`); the layer only checks that GROUPED is the dispatch.

Under a mesh (`use_rules` with more than one device) the routed experts go through the
expert-parallel `shard_map` of `moe_ep.py` (all-to-all over `expert`, each chip routing only its
own tokens); the backends above then run each chip's local experts. Without a mesh they run
on the whole token set, as before. The expert-parallel path may drop choices past a capacity
(`cfg.moe_capacity_factor`, None = dropless); the layer returns how many it dropped.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from avalon import sharding
from avalon.model import moe_ep
from avalon.model.activations import activate, activate_grad, relu2
from avalon.model.config import Activation, ModelConfig, MoeBackend, Remat, Router
from avalon.model.dense import BackendWeight, dense
from avalon.model.ops import PLAIN, Ops
from avalon.sharding import constrain

ROUTED_NAME = "moe_routed"  # checkpoint name of the expert-parallel routed output

def route(p: dict, x: jax.Array, cfg: ModelConfig, routing=None):
    """x [n, D] -> (experts [n, k] int32, gate weights [n, k] fp32)."""
    w_r = p["router"].astype(jnp.float32)
    if cfg.router_frozen:
        w_r = jax.lax.stop_gradient(w_r)
    logits = x.astype(jnp.float32) @ w_r  # [n, E]
    if cfg.router == Router.SOFTMAX:
        scores = jax.nn.softmax(logits, axis=-1)
        choice = scores
    else:
        bias = p["router_bias"].astype(jnp.float32)
        if cfg.router_frozen:
            bias = jax.lax.stop_gradient(bias)
        scores = jax.nn.sigmoid(logits)
        choice = scores + bias
    if routing is None:
        idx = select_experts(choice, cfg)
    else:
        idx = routing.astype(jnp.int32)
    weights = jnp.take_along_axis(scores, idx, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return idx, weights * cfg.routed_scaling_factor


def select_experts(choice_scores: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Group-limited top-k on the bias-corrected scores [n, E] -> [n, k] int32."""
    n, e = choice_scores.shape
    if cfg.n_group > 1:
        grouped = choice_scores.reshape(n, cfg.n_group, e // cfg.n_group)
        group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [n, n_group]
        _, keep = jax.lax.top_k(group_score, cfg.topk_group)
        # A comparison, not a scatter: elementwise per token, so a token-sharded input needs
        # no gather (XLA all-gathers the tokens for a scatter indexed by arange(n)).
        kept = jnp.any(keep[:, :, None] == jnp.arange(cfg.n_group)[None, None, :], axis=1)
        choice_scores = jnp.where(jnp.repeat(kept, e // cfg.n_group, axis=1), choice_scores,
                                  -jnp.inf)
    _, idx = jax.lax.top_k(choice_scores, cfg.num_experts_per_tok)
    return jax.lax.stop_gradient(idx.astype(jnp.int32))


def _route_per_chip(p, x2, cfg: ModelConfig, replay, mesh, axes: tuple[str, ...]):
    """`route` on each chip's own tokens (the router weight is replicated: [D, E] is small), so
    neither tokens nor routing are gathered (the CPU partitioner gathers a token-sharded
    top_k otherwise)."""
    tokens = PartitionSpec(axes or None)
    w = p["router"]
    # The softmax router has no correction bias: a zero stands in (route ignores it).
    bias = p.get("router_bias", jnp.zeros((w.shape[-1],), jnp.float32))
    if replay is None:
        def fn(w, bias, x):
            return route({"router": w, "router_bias": bias}, x, cfg)
        args, specs = (w, bias, x2), (PartitionSpec(), PartitionSpec(), tokens)
    else:
        def fn(w, bias, x, r):
            return route({"router": w, "router_bias": bias}, x, cfg, r)
        args, specs = (w, bias, x2, replay), (PartitionSpec(), PartitionSpec(), tokens, tokens)
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=(tokens, tokens),
                         check_vma=False)(*args)


# ---- routed expert dispatch: x_l [n, w], idx/weights [n, k] -> per-choice outputs [n, k, w] --
def _experts_dense(xl, idx, up, down, act=Activation.RELU2):
    h = activate(act, jnp.einsum("nw,ewf->nef", xl, up))
    out = jnp.einsum("nef,efw->new", h, down)  # [n, E, w]
    return jnp.take_along_axis(out, idx[..., None], axis=1)  # [n, k, w]


def sort_choices(idx, e: int):
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=e)
    return flat, order, counts


def _experts_ragged(xl, idx, up, down, act=Activation.RELU2):
    n, k = idx.shape
    flat, order, counts = sort_choices(idx, up.shape[0])
    xs = xl[order // k]
    h = activate(act, jax.lax.ragged_dot(xs, up, counts))
    ys = jax.lax.ragged_dot(h, down, counts)
    out = jnp.zeros_like(ys).at[order].set(ys)
    return out.reshape(n, k, -1)


def capacity_ladder(n: int, k: int, e: int) -> tuple[int, ...]:
    """Static per-expert capacities tried from small to large; the last (n) can never overflow,
    since a token picks an expert at most once."""
    avg = n * k / e
    caps = {min(n, max(8, int(math.ceil(avg * f / 8)) * 8)) for f in (1.25, 1.6, 2.0, 3.0)}
    return tuple(sorted(caps | {n}))


def _experts_capacity(xl, idx, up, down, act=Activation.RELU2):
    n, k = idx.shape
    e = up.shape[0]
    flat, order, counts = sort_choices(idx, e)
    starts = jnp.cumsum(counts) - counts
    sorted_e = flat[order]
    rank = jnp.arange(n * k) - starts[sorted_e]  # position within its expert's group
    ladder = capacity_ladder(n, k, e)
    which = jnp.searchsorted(jnp.asarray(ladder), jnp.max(counts), side="left")
    i32 = lambda a: a.astype(jnp.int32)  # noqa: E731
    return _bucketed_experts(xl, up, down, i32(order), i32(sorted_e), i32(rank), i32(which),
                             act)


def _bucket_maps(order, sorted_e, rank, e: int, cap: int):
    """Where each choice sits in the [e * cap] buffer rows, for sorted choice j (choice
    order[j] = token * k + slot): slot_sorted [n*k] its row; slot [n*k] the row of choice c;
    src [e*cap] the choice in each row and src_sorted [e*cap] its sorted index (n*k: empty).
    Integer scatters of n * k entries."""
    nk = order.shape[0]
    slot_sorted = sorted_e * cap + rank
    slot = jnp.zeros(nk, jnp.int32).at[order].set(slot_sorted)
    src = jnp.full(e * cap, nk, jnp.int32).at[slot_sorted].set(order)
    src_sorted = jnp.full(e * cap, nk, jnp.int32).at[slot_sorted].set(
        jnp.arange(nk, dtype=jnp.int32))
    return slot_sorted, slot, src, src_sorted


def with_zero_row(a):
    return jnp.concatenate([a, jnp.zeros((1, a.shape[-1]), a.dtype)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _bucketed_experts(xl, up, down, order, sorted_e, rank, which, act):
    """Routed experts through a [e, cap, w] buffer, cap the `which`-th rung of the capacity
    ladder (`lax.switch`): x_l [n, w] -> per-choice outputs [n, k, w].

    Both directions move rows with gathers only (a token's row into the buffer, the outputs
    back; in the backward the output gradient into the buffer, the input gradient back and a
    sum over k), never a scatter-add. The custom VJP sits outside the switch, so the saved
    activations have one shape for every rung ([n * k, f] pre-activations, rows sorted by
    expert): differentiating through the switch instead makes every rung's buffers residuals,
    zero-filled for the rungs not taken (the largest has n rows per expert)."""
    return _bucketed_fwd(xl, up, down, order, sorted_e, rank, which, act)[0]


def _bucketed_fwd(xl, up, down, order, sorted_e, rank, which, act):
    n, w = xl.shape
    e = up.shape[0]
    k = order.shape[0] // n

    def run(cap):
        def branch(xl, up, down):
            slot_sorted, slot, src, _ = _bucket_maps(order, sorted_e, rank, e, cap)
            buf = jnp.take(with_zero_row(xl), src // k, axis=0).reshape(e, cap, w)
            pre = jnp.einsum("ecw,ewf->ecf", buf, up)
            y = jnp.einsum("ecf,efw->ecw", activate(act, pre), down).reshape(e * cap, -1)
            out = jnp.take(y, slot, axis=0).reshape(n, k, -1)
            return out, jnp.take(pre.reshape(e * cap, -1), slot_sorted, axis=0)
        return branch

    ladder = capacity_ladder(n, k, e)
    out, pre_sorted = jax.lax.switch(which, [run(c) for c in ladder], xl, up, down)
    return out, (xl, up, down, order, sorted_e, rank, which, pre_sorted)


def _bucketed_bwd(act, res, g):
    xl, up, down, order, sorted_e, rank, which, pre_sorted = res
    n, k, w = g.shape
    e = up.shape[0]

    def run(cap):
        def branch(xl, up, down, pre_sorted, g):
            _, slot, src, src_sorted = _bucket_maps(order, sorted_e, rank, e, cap)
            buf = jnp.take(with_zero_row(xl), src // k, axis=0).reshape(e, cap, -1)
            pre = jnp.take(with_zero_row(pre_sorted), src_sorted, axis=0).reshape(e, cap, -1)
            g_y = jnp.take(with_zero_row(g.reshape(n * k, w)), src, axis=0).reshape(e, cap, w)
            g_down = jnp.einsum("ecf,ecw->efw", activate(act, pre), g_y)
            g_pre = activate_grad(act, pre, jnp.einsum("ecw,efw->ecf", g_y, down))
            g_up = jnp.einsum("ecw,ecf->ewf", buf, g_pre)
            g_buf = jnp.einsum("ecf,ewf->ecw", g_pre, up).reshape(e * cap, -1)
            g_x = jnp.take(g_buf, slot, axis=0).reshape(n, k, -1).sum(axis=1)
            return g_x, g_up, g_down
        return branch

    ladder = capacity_ladder(n, k, e)
    g_x, g_up, g_down = jax.lax.switch(which, [run(c) for c in ladder], xl, up, down,
                                       pre_sorted, g)
    return g_x, g_up, g_down, None, None, None, None


_bucketed_experts.defvjp(_bucketed_fwd, _bucketed_bwd)


# Rows per tile of the grouped backend at most; fewer when the choices are few (decode).
GROUP_TILE = 256


def group_tile(nk: int, e: int) -> int:
    """Tile rows for `nk` choices over `e` experts: the largest power of two <= nk / e, within
    [8, GROUP_TILE], so a tile is about one expert's mean load at most."""
    t = 8
    while t * 2 <= min(GROUP_TILE, nk // e):
        t *= 2
    return t


def grouped_plan(idx, e: int):
    """The grouped backend's layout of the choices idx [n, k] over e experts: (tile rows,
    order [n*k], slot_sorted [n*k] (buffer row of sorted choice j), tile_expert [tiles],
    occupied tiles (int32 scalar))."""
    n, k = idx.shape
    tile = group_tile(n * k, e)
    flat, order, counts = sort_choices(idx, e)
    starts = jnp.cumsum(counts) - counts
    sorted_e = flat[order]
    rank = jnp.arange(n * k) - starts[sorted_e]
    tiles_of = (counts + tile - 1) // tile
    first_tile = jnp.cumsum(tiles_of) - tiles_of
    slot_sorted = first_tile[sorted_e] * tile + rank  # buffer row of sorted choice j
    num_tiles = (n * k + e * (tile - 1)) // tile  # >= sum(tiles_of) for any routing
    # Tile i belongs to the expert whose tiles span it; tiles past the last are unused.
    tile_expert = jnp.minimum(jnp.searchsorted(jnp.cumsum(tiles_of), jnp.arange(num_tiles),
                                               side="right"), e - 1)
    i32 = lambda a: a.astype(jnp.int32)  # noqa: E731
    return tile, i32(order), i32(slot_sorted), i32(tile_expert), i32(jnp.sum(tiles_of))


def _experts_grouped(xl, idx, up, down, act=Activation.RELU2):
    """Sort by expert, pad each expert's rows to whole tiles of `group_tile` rows, and run the
    occupied tiles one by one in a loop, each against its own expert's weights read in place.
    Padding is under one tile per expert, whatever the load (the capacity buffer pads every
    expert to the busiest one, 1.6-2x the mean), and the tiles past the last occupied one are
    not computed at all."""
    _, order, slot_sorted, tile_expert, used = grouped_plan(idx, up.shape[0])
    return _grouped_experts(xl, up, down, order, slot_sorted, tile_expert, used, act)


def grouped_maps(order, slot_sorted, rows: int):
    """slot [n*k]: buffer row of choice c; src [rows]: the choice in each row (n*k: empty)."""
    nk = order.shape[0]
    slot = jnp.zeros(nk, jnp.int32).at[order].set(slot_sorted)
    src = jnp.full(rows, nk, jnp.int32).at[slot_sorted].set(order)
    return slot, src


def tile_rows(src, i, tile: int):
    """The buffer rows of tile i: each row's choice (n*k for an empty row)."""
    return jax.lax.dynamic_slice_in_dim(src, i * tile, tile)


def transposed(a: jax.Array) -> jax.Array:
    """a.T as its own array: the barrier stops XLA folding the transpose into the next dot, so
    the weight gradients below are products of untransposed operands (on XLA:CPU one whose left
    operand contracts its leading axis ran at half the rate of the same product on the copy;
    the copy is one pass over the operand)."""
    return jax.lax.optimization_barrier(a.T)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _grouped_experts(xl, up, down, order, slot_sorted, tile_expert, used, act):
    """x_l [n, w] -> per-choice outputs [n, k, w], `used` occupied tiles of rows in a loop.

    Why a loop rather than one batched matmul over [tiles, tile, w]: on XLA:CPU the batched
    product needs each tile's expert weights gathered into a [tiles, w, f] copy, computes the
    empty tiles too, and runs at 45-65 GFLOP/s; the loop reads `up[e]` in place, stops at the
    last occupied tile, and its 2-D products run at the single-GEMM rate (the toy layer's
    routed experts, fwd+bwd at 4,096 tokens: 360 -> 230-245 ms, one core). Rows move by
    gathers in both directions; each tile's weight gradient is added into its expert's slice
    (no scatter-add over rows)."""
    return _grouped_fwd(xl, up, down, order, slot_sorted, tile_expert, used, act)[0]


def _grouped_fwd(xl, up, down, order, slot_sorted, tile_expert, used, act):
    n, w = xl.shape
    k = order.shape[0] // n
    tiles = tile_expert.shape[0]
    tile = group_tile(n * k, up.shape[0])
    slot, src = grouped_maps(order, slot_sorted, tiles * tile)
    rows_in = with_zero_row(xl)

    def one_tile(i, carry):
        y, pre = carry
        e = tile_expert[i]
        buf = jnp.take(rows_in, tile_rows(src, i, tile) // k, axis=0)
        pre_i = buf @ up[e]
        y = jax.lax.dynamic_update_slice_in_dim(y, activate(act, pre_i) @ down[e], i * tile, 0)
        return y, jax.lax.dynamic_update_index_in_dim(pre, pre_i, i, 0)

    init = (jnp.zeros((tiles * tile, w), xl.dtype),
            jnp.zeros((tiles, tile, up.shape[-1]), xl.dtype))
    y, pre = jax.lax.fori_loop(0, used, one_tile, init)
    out = jnp.take(y, slot, axis=0).reshape(n, k, w)
    return out, (xl, up, down, order, slot_sorted, tile_expert, used, pre)


def _grouped_bwd(act, res, g):
    xl, up, down, order, slot_sorted, tile_expert, used, pre = res
    n, k, w = g.shape
    tiles, tile = pre.shape[:2]
    slot, src = grouped_maps(order, slot_sorted, tiles * tile)
    rows_in = with_zero_row(xl)
    rows_g = with_zero_row(g.reshape(n * k, w))

    def one_tile(i, carry):
        g_up, g_down, g_rows = carry
        e = tile_expert[i]
        rows = tile_rows(src, i, tile)
        buf = jnp.take(rows_in, rows // k, axis=0)
        g_y = jnp.take(rows_g, rows, axis=0)
        pre_i = pre[i]
        g_down = g_down.at[e].add(transposed(activate(act, pre_i)) @ g_y)
        g_pre = activate_grad(act, pre_i, g_y @ down[e].T)
        g_up = g_up.at[e].add(transposed(buf) @ g_pre)
        g_rows = jax.lax.dynamic_update_slice_in_dim(g_rows, g_pre @ up[e].T, i * tile, 0)
        return g_up, g_down, g_rows

    init = (jnp.zeros_like(up), jnp.zeros_like(down), jnp.zeros((tiles * tile, w), g.dtype))
    g_up, g_down, g_rows = jax.lax.fori_loop(0, used, one_tile, init)
    # Each token's k rows summed by k - 1 adds of [n, w] gathers: as a reduction over the k
    # axis XLA:CPU runs it through a YNNPACK reduce fusion, several times slower.
    slots = slot.reshape(n, k)
    g_x = jnp.take(g_rows, slots[:, 0], axis=0)
    for j in range(1, k):
        g_x = g_x + jnp.take(g_rows, slots[:, j], axis=0)
    return g_x, g_up, g_down, None, None, None, None


_grouped_experts.defvjp(_grouped_fwd, _grouped_bwd)


def fused_up(p: dict):
    """The routed experts' up weight as the dispatch backends take it: `experts_up` [E, w, f],
    or under SWIGLU the gate and up side by side [E, w, 2f] (`activations.py`). A backend's
    decode layout may hold the fused weight already (`experts_gate_up`, made once per weight
    set by `backends.decode.out_in_params`)."""
    if "experts_gate_up" in p:
        return p["experts_gate_up"]
    if "experts_gate" in p:
        return jnp.concatenate([p["experts_gate"], p["experts_up"]], axis=-1)
    return p["experts_up"]


_DISPATCH = {
    MoeBackend.DENSE: _experts_dense,
    MoeBackend.RAGGED_DOT: _experts_ragged,
    MoeBackend.CAPACITY_BUCKETS: _experts_capacity,
    MoeBackend.GROUPED: _experts_grouped,
}


def _shared_expert(p: dict, x2, act: Activation, ops: Ops = PLAIN):
    """The shared expert: relu2(x2 W_up + b) W_down + b (SWIGLU: silu(x2 W_gate) * (x2 W_up)),
    in x2's dtype."""
    dtype = x2.dtype
    h = dense(x2, p["shared_up"].astype(dtype), ops=ops)
    if "shared_up_bias" in p:
        h = h + p["shared_up_bias"].astype(dtype)
    if act == Activation.SWIGLU:
        h = jax.nn.silu(dense(x2, p["shared_gate"].astype(dtype), ops=ops)) * h
    else:
        h = relu2(h)
    shared = dense(h, p["shared_down"].astype(dtype), ops=ops)
    if "shared_down_bias" in p:
        shared = shared + p["shared_down_bias"].astype(dtype)
    return shared


def moe_layer(p: dict, x: jax.Array, cfg: ModelConfig, *, routing=None, backend=None,
              ops: Ops = PLAIN):
    """x [b, t, D] (normed) -> (y [b, t, D], experts chosen [b, t, k] int32, choices dropped
    by the expert-parallel capacity bound (int32 scalar; 0 without a mesh, or when
    `cfg.moe_capacity_factor` is None)). A dropped choice adds nothing to y (moe_ep.py)."""
    b, t, d = x.shape
    dtype = x.dtype
    x2 = x.reshape(b * t, d)
    replay = None if routing is None else routing.reshape(b * t, -1)
    active = sharding.active()
    mesh = sharding.active_mesh()
    if mesh is None:
        idx, weights = route(p, x2, cfg, replay)
    else:
        # The flat tokens [b * t] are split over the rows' axes and then, under sequence
        # parallelism, the positions' axes: with one row per row-shard each chip's flat block
        # is its own positions, so the reshape moves nothing.
        spec = sharding.logical_to_spec(("batch", "act_seq"), active[1], mesh, (b, t))
        axes = tuple(a for part in spec if part is not None
                     for a in (part if isinstance(part, tuple) else (part,)))
        idx, weights = _route_per_chip(p, x2, cfg, replay, mesh, axes)

    xl = x2
    if cfg.moe_latent_size is not None:
        xl = dense(x2, p["latent_in"].astype(dtype), ops=ops)
        if "latent_in_bias" in p:
            xl = xl + p["latent_in_bias"].astype(dtype)
    act = cfg.mlp_activation
    up, down = fused_up(p).astype(dtype), p["experts_down"].astype(dtype)
    chosen = backend or cfg.moe_backend
    if chosen == MoeBackend.AUTO:
        chosen = ops.moe_backend
    if mesh is not None:
        routed, dropped = moe_ep.expert_parallel(
            xl, idx, weights, up, down, mesh=mesh, batch_axes=axes, backend=chosen, act=act,
            chunk=cfg.moe_dispatch_chunk, capacity_factor=cfg.moe_capacity_factor,
            remat_chunks=cfg.remat != Remat.NONE, gmm=ops.grouped_matmul)
        # Named for Remat.SELECTIVE(_UNITS): the recompute keeps this output instead of
        # running the routed experts again (model.py); their chunks recompute themselves.
        routed = checkpoint_name(routed, ROUTED_NAME)
    else:
        if chosen == MoeBackend.MEGABLOX:
            raise ValueError("ModelConfig.moe_backend='megablox' runs only expert-parallel "
                             "under a mesh")
        if isinstance(up, BackendWeight):
            # A backend's decode layout (the engine's on CPU, `avalon/backends/`): its own
            # forward of the grouped dispatch.
            if chosen != MoeBackend.GROUPED:
                raise ValueError(f"moe_layer: the engine's expert layouts run grouped only, not "
                                 f"backend={chosen.value!r} (backends.decode.out_in_params "
                                 "keeps them [E, in, out])")
            per_choice = up.routed_experts(xl, idx, down, act)
        else:
            per_choice = _DISPATCH[chosen](xl, idx, up, down, act)
        dropped = jnp.zeros((), jnp.int32)  # the single-device backends are dropless
        routed = jnp.einsum("nkw,nk->nw", per_choice.astype(jnp.float32),
                            weights).astype(dtype)
    if cfg.moe_latent_size is not None:
        routed = dense(routed, p["latent_out"].astype(dtype), ops=ops)
        if "latent_out_bias" in p:
            routed = routed + p["latent_out_bias"].astype(dtype)

    y = routed
    if cfg.moe_shared_expert_intermediate_size:
        y = y + _shared_expert({k: v for k, v in p.items() if k.startswith("shared_")}, x2,
                               act, ops)
    y = y.reshape(b, t, d)
    return constrain(y, ("batch", "act_seq", "act_embed")), idx.reshape(b, t, -1), dropped
