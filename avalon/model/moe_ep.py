"""Expert-parallel dispatch of routed experts: `shard_map` with all-to-all over `expert`.

Under a mesh (inside `use_rules`), tokens stay where the batch rule put them (sharded over
data / fsdp / expert, so every chip routes only its own tokens) and the routed experts are
split over the `expert` axis (E / ep experts per chip). Per chip, per chunk of its tokens:

    choices (token, expert) sorted by expert      -> destination chip = expert // (E / ep)
    send [ep, C, w]  --all_to_all(expert)-->  recv [ep, C, w]  (rows for my experts)
    my experts on the received rows (grouped matmul of the config's backend)
    back [ep, C, w]  --all_to_all(expert)-->  the outputs of my choices, unsorted
    the gate-weighted sum over each token's k choices, per chunk          -> [chunk, w]

C, the rows each destination takes from each source, is the capacity of
`ModelConfig.moe_capacity_factor` f: C = min(chunk x k, ceil(f x chunk x k / ep)), f times a
destination's mean load. A choice past C at its destination (in token order: the chunk's last
tokens lose first, as GShard and Switch drop) is *dropped*: it contributes zero, and the layer
returns how many were (`expert_parallel`'s second output, summed over chips; the update step
reports it as `moe_dropped_choices`). f = None is the worst case C = chunk x k: dropless, at
the price of grouped-matmul shapes (and megablox's static grid) over all ep x C received rows,
ep times the choices a balanced chip really holds; f = 1.25 makes them 1.25 times. At ep = 1
every f >= 1 is dropless (one destination, C = chunk x k).

The token chunk (`ModelConfig.moe_dispatch_chunk`, a `lax.scan`) bounds the buffers:
2 x ep x C x w. No activation or routing array is gathered across chips; the only other
collectives are the FSDP all-gather of this chip's expert weights (the jit does it before the
`shard_map`, and the matching reduce-scatter of their gradients) and nothing else.

Received rows that hold no choice carry the sentinel expert E / ep: they are sorted last and
lie outside every group of the grouped matmul, so their output rows are zero.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from avalon.model.activations import activate
from avalon.model.config import Activation, MoeBackend

# MEGABLOX tiles the rows (m) of its grouped matmul in whole tiles of at least 128 and needs m
# divisible by the tile. The capacity is rounded up to this many rows so the buffers divide it;
# otherwise the only tile that divides m is m itself: one [m, 1024] block per kernel (the
# pod's 99,124 rows, 203 MB against a TensorCore's 16 MiB of scoped VMEM), which libtpu spends
# up to 85 minutes per kernel trying to compile.
MEGABLOX_ROWS = 128


def _grouped(xs, counts, w, backend: MoeBackend, gmm=None):
    """xs [R, a] sorted by group, counts [G] -> [R, b]: row r times w[group of r]; rows past
    sum(counts) are zeros, except under megablox, which leaves them unwritten (whatever the
    buffer held): `local_experts` puts them on the sentinel rows, which no caller reads.
    MEGABLOX runs `gmm`, the platform's grouped matmul (`ops.Ops.grouped_matmul`)."""
    if backend == MoeBackend.MEGABLOX:
        if gmm is None:
            raise ValueError("ModelConfig.moe_backend='megablox': no grouped matmul was given "
                             "for it (ops.Ops.grouped_matmul: the TPU's, from avalon/backends)")
        return gmm(xs, w, counts)
    if backend == MoeBackend.RAGGED_DOT:
        return jax.lax.ragged_dot(xs, w, counts.astype(jnp.int32))
    # DENSE / CAPACITY_BUCKETS / GROUPED: every row through every local expert, then the row's
    # own one (the readable reference; CPU tests).
    g = w.shape[0]
    ends = jnp.cumsum(counts)
    group = jnp.searchsorted(ends, jnp.arange(xs.shape[0]), side="right")  # g = past the end
    out = jnp.einsum("ra,gab->rgb", xs, w)
    hit = group[:, None] == jnp.arange(g)[None, :]
    return jnp.einsum("rgb,rg->rb", out, hit.astype(out.dtype))


def local_experts(x_rows, e_rows, up, down, backend: MoeBackend,
                  act: Activation = Activation.RELU2, gmm=None):
    """x_rows [R, w], e_rows [R] local expert ids (sentinel = up.shape[0] for empty rows)
    -> [R, w]; empty rows are zero, or unspecified under megablox (see `_grouped`): the
    dispatch reads only the rows of kept choices, in the forward and in the backward."""
    g = up.shape[0]
    order = jnp.argsort(e_rows, stable=True)
    counts = jnp.zeros((g + 1,), jnp.int32).at[e_rows].add(1)[:g]
    xs = x_rows[order]
    h = activate(act, _grouped(xs, counts, up, backend, gmm))
    ys = _grouped(h, counts, down, backend, gmm)
    return jnp.zeros_like(ys).at[order].set(ys)


def capacity(n: int, k: int, ep: int, factor: float | None, multiple: int = 1) -> int:
    """Rows each destination takes from one source chip per chunk of n tokens x k choices:
    `factor` times the mean load n k / ep rounded up to a multiple of `multiple`, at most the
    worst case n k (None: n k, dropless)."""
    if factor is None:
        return n * k
    return min(n * k, -(-math.ceil(factor * n * k / ep) // multiple) * multiple)


def _dispatch_chunk(xl, idx, weights, up, down, *, ep: int, backend: MoeBackend,
                    factor: float | None, act: Activation = Activation.RELU2, gmm=None):
    """One chunk on one chip: xl [n, w], idx [n, k] global experts, weights [n, k] fp32 gates
    -> (sum over the k choices of gate x expert output [n, w] in xl's dtype, choices dropped
    (int32 scalar))."""
    n, k = idx.shape
    e_local = up.shape[0]
    cap = capacity(n, k, ep, factor, MEGABLOX_ROWS if backend == MoeBackend.MEGABLOX else 1)
    flat = idx.reshape(-1)  # choice c = token c // k, slot c % k
    dest = flat // e_local
    # Grouped by destination, token order within a group (stable): the rank of a choice among
    # those its destination receives from this chip decides whether it fits.
    order = jnp.argsort(dest, stable=True)
    sorted_dest = dest[order]
    counts = jnp.zeros((ep,), jnp.int32).at[dest].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(n * k) - starts[sorted_dest]
    kept = rank < cap
    slot = jnp.where(kept, sorted_dest * cap + rank, ep * cap)  # ep * cap: out of range
    send_x = jnp.zeros((ep * cap, xl.shape[-1]), xl.dtype).at[slot].set(xl[order // k],
                                                                        mode="drop")
    send_e = jnp.full((ep * cap,), e_local, jnp.int32).at[slot].set(
        flat[order] % e_local, mode="drop")
    a2a = functools.partial(jax.lax.all_to_all, axis_name="expert", split_axis=0,
                            concat_axis=0, tiled=True)
    recv_x, recv_e = a2a(send_x), a2a(send_e)
    y = local_experts(recv_x, recv_e, up, down, backend, act, gmm)
    back = a2a(y)
    ys = jnp.where(kept[:, None], back[jnp.minimum(slot, ep * cap - 1)], 0)
    out = jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)
    # Combined here, per chunk: the per-choice outputs of a chip's tokens ([tokens, k, w], fp32
    # for the combine: 2.95 GB per MoE layer for 32K tokens of Super) never exist at once.
    combined = jnp.einsum("nkw,nk->nw", out.astype(jnp.float32), weights).astype(xl.dtype)
    return combined, jnp.sum(~kept, dtype=jnp.int32)


def expert_parallel(xl, idx, weights, up, down, *, mesh: Mesh, batch_axes: tuple[str, ...],
                    backend: MoeBackend, chunk: int, capacity_factor: float | None,
                    remat_chunks: bool = False, act: Activation = Activation.RELU2, gmm=None):
    """xl [n, w], idx [n, k] and gate weights [n, k] (fp32) sharded over `batch_axes`;
    up [E, w, f] ([E, w, 2f] gate | up under SWIGLU), down [E, f, w] split over `expert`
    -> (the gate-weighted sum of each token's expert outputs [n, w] in xl's dtype, sharded like xl,
    dropped choices adding zero; choices dropped by the capacity bound, an int32 scalar summed over
    all chips).

    `remat_chunks`: when a chip's tokens take several chunks, recompute each chunk's dispatch
    in the backward pass instead of keeping its buffers (2 x ep x C rows, pre-activations) for
    every chunk at once: with 32 chunks of a 131K-token row those residuals are tens of GB.
    The price is one more forward of the routed experts. `gmm`: MEGABLOX's grouped matmul."""
    ep = mesh.shape["expert"]
    if up.shape[0] % ep:
        raise ValueError(f"ModelConfig.n_routed_experts={up.shape[0]} is not divisible by the "
                         f"expert mesh axis ({ep})")
    tokens = PartitionSpec(batch_axes or None)
    experts = PartitionSpec("expert" if ep > 1 else None)

    def per_chip(xl, idx, weights, up, down):
        n = xl.shape[0]
        c = min(chunk, n)
        if n % c:
            raise ValueError(f"ModelConfig.moe_dispatch_chunk={chunk}: must divide the "
                             f"{n} tokens each chip routes")
        run = functools.partial(_dispatch_chunk, up=up, down=down, ep=ep, backend=backend,
                                factor=capacity_factor, act=act, gmm=gmm)
        if c == n:
            out, dropped = run(xl, idx, weights)
            return out, dropped[None]
        xs, ids = xl.reshape(n // c, c, -1), idx.reshape(n // c, c, -1)
        ws = weights.reshape(n // c, c, -1)
        one = jax.checkpoint(run) if remat_chunks else run
        _, (out, dropped) = jax.lax.scan(lambda _, a: (None, one(*a)), None, (xs, ids, ws))
        return out.reshape(n, -1), jnp.sum(dropped)[None]

    # Each chip's count comes out as one entry of a [chips along batch_axes] vector.
    out, dropped = jax.shard_map(per_chip, mesh=mesh,
                                 in_specs=(tokens, tokens, tokens, experts, experts),
                                 out_specs=(tokens, tokens), check_vma=False)(
        xl, idx, weights, up, down)
    return out, jnp.sum(dropped)
