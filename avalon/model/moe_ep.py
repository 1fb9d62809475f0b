"""Expert-parallel dispatch of routed experts: `shard_map` with all-to-all over `expert`.

Under a mesh (inside `use_rules`), tokens stay where the batch rule put them (sharded over
data / fsdp / expert, so every chip routes only its own tokens) and the routed experts are
split over the `expert` axis (E / ep experts per chip). Per chip, per chunk of its tokens:

    choices (token, expert) sorted by expert      -> destination chip = expert // (E / ep)
    send [ep, C, w]  --all_to_all(expert)-->  recv [ep, C, w]  (rows for my experts)
    my experts on the received rows (grouped matmul of the config's backend)
    back [ep, C, w]  --all_to_all(expert)-->  the outputs of my choices, unsorted

C = chunk x k: a destination can receive every choice of the chunk, so nothing is ever
dropped (dropless, like the single-device backends) and the buffers are static. The token
chunk (`ModelConfig.moe_dispatch_chunk`, a `lax.scan`) bounds them: 2 x ep x chunk x k x w.
No activation or routing array is gathered across chips; the only other collectives are the
FSDP all-gather of this chip's expert weights (the jit does it before the `shard_map`, and the
matching reduce-scatter of their gradients) and nothing else.

Received rows that hold no choice (C is a worst case) carry the sentinel expert E / ep: they are
sorted last and lie outside every group of the grouped matmul, so their output rows are zero.
The price of static, dropless buffers: the grouped matmul's shapes (and megablox's static grid)
span all ep x C received rows, about ep times the choices a balanced chip really holds. A
capacity bound (with a drop count) or a dynamic-grid kernel is what removes that factor; until
then ep = 1 (fsdp only) has no such waste, at the cost of gathering every expert's weights.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from avalon.model.config import MoeBackend


def relu2(x):
    return jnp.square(jax.nn.relu(x))


def _tile(dim: int, most: int) -> int:
    """The largest power-of-two tile <= `most` (and >= 128) that divides `dim`, else `dim`."""
    t = most
    while t >= 128:
        if dim % t == 0:
            return t
        t //= 2
    return dim


def _grouped(xs, counts, w, backend: MoeBackend):
    """xs [R, a] sorted by group, counts [G] -> [R, b]: row r times w[group of r]; rows past
    sum(counts) give zeros."""
    if backend == MoeBackend.MEGABLOX:
        from jax.experimental.pallas.ops.tpu.megablox import ops as megablox
        tiling = (_tile(xs.shape[0], 512), _tile(xs.shape[1], 1024), _tile(w.shape[2], 1024))
        return megablox.gmm(xs, w, counts.astype(jnp.int32), preferred_element_type=xs.dtype,
                            tiling=tiling)
    if backend == MoeBackend.RAGGED_DOT:
        return jax.lax.ragged_dot(xs, w, counts.astype(jnp.int32))
    # DENSE / CAPACITY_BUCKETS: every row through every local expert, then the row's own one
    # (the readable reference; CPU tests).
    g = w.shape[0]
    ends = jnp.cumsum(counts)
    group = jnp.searchsorted(ends, jnp.arange(xs.shape[0]), side="right")  # g = past the end
    out = jnp.einsum("ra,gab->rgb", xs, w)
    hit = group[:, None] == jnp.arange(g)[None, :]
    return jnp.einsum("rgb,rg->rb", out, hit.astype(out.dtype))


def local_experts(x_rows, e_rows, up, down, backend: MoeBackend):
    """x_rows [R, w], e_rows [R] local expert ids (sentinel = up.shape[0] for empty rows)
    -> [R, w], zero on empty rows."""
    g = up.shape[0]
    order = jnp.argsort(e_rows, stable=True)
    counts = jnp.zeros((g + 1,), jnp.int32).at[e_rows].add(1)[:g]
    xs = x_rows[order]
    h = relu2(_grouped(xs, counts, up, backend))
    ys = _grouped(h, counts, down, backend)
    return jnp.zeros_like(ys).at[order].set(ys)


def _dispatch_chunk(xl, idx, up, down, *, ep: int, backend: MoeBackend):
    """One chunk on one chip: xl [n, w], idx [n, k] global experts -> per choice [n, k, w]."""
    n, k = idx.shape
    e_local = up.shape[0]
    cap = n * k  # worst case per destination: dropless
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sorted_e = flat[order]
    dest = sorted_e // e_local
    counts = jnp.zeros((ep,), jnp.int32).at[dest].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(n * k) - starts[dest]
    slot = dest * cap + rank
    send_x = jnp.zeros((ep * cap, xl.shape[-1]), xl.dtype).at[slot].set(xl[order // k])
    send_e = jnp.full((ep * cap,), e_local, jnp.int32).at[slot].set(sorted_e % e_local)
    a2a = functools.partial(jax.lax.all_to_all, axis_name="expert", split_axis=0,
                            concat_axis=0, tiled=True)
    recv_x, recv_e = a2a(send_x), a2a(send_e)
    y = local_experts(recv_x, recv_e, up, down, backend)
    back = a2a(y)
    ys = back[slot]  # outputs of my choices, in sorted order
    return jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)


def expert_parallel(xl, idx, up, down, *, mesh: Mesh, batch_axes: tuple[str, ...],
                    backend: MoeBackend, chunk: int):
    """xl [n, w] and idx [n, k] sharded over `batch_axes`; up [E, w, f], down [E, f, w] split
    over `expert` -> per-choice outputs [n, k, w] sharded like xl."""
    ep = mesh.shape["expert"]
    if up.shape[0] % ep:
        raise ValueError(f"ModelConfig.n_routed_experts={up.shape[0]} is not divisible by the "
                         f"expert mesh axis ({ep})")
    tokens = PartitionSpec(batch_axes or None)
    experts = PartitionSpec("expert" if ep > 1 else None)

    def per_chip(xl, idx, up, down):
        n = xl.shape[0]
        c = min(chunk, n)
        if n % c:
            raise ValueError(f"ModelConfig.moe_dispatch_chunk={chunk}: must divide the "
                             f"{n} tokens each chip routes")
        run = functools.partial(_dispatch_chunk, up=up, down=down, ep=ep, backend=backend)
        if c == n:
            return run(xl, idx)
        xs, ids = xl.reshape(n // c, c, -1), idx.reshape(n // c, c, -1)
        _, out = jax.lax.scan(lambda _, a: (None, run(*a)), None, (xs, ids))
        return out.reshape(n, idx.shape[1], -1)

    return jax.shard_map(per_chip, mesh=mesh, in_specs=(tokens, tokens, experts, experts),
                         out_specs=tokens, check_vma=False)(xl, idx, up, down)
