"""MEGABLOX's grouped matmul on TPU: the Pallas megablox kernel (gmm forward, gmm/tgmm
backward), the TPU's `Ops.grouped_matmul` for the expert-parallel dispatch (`model.moe_ep`).

The capacity of a MEGABLOX dispatch is rounded to whole `moe_ep.MEGABLOX_ROWS`, so the rows
divide the kernel's row tile (see there).
"""

from __future__ import annotations

import jax.numpy as jnp

from avalon.model.moe_ep import MEGABLOX_ROWS


def _tile(dim: int, most: int) -> int:
    """The largest power-of-two tile <= `most` (and >= 128) that divides `dim`, else `dim`."""
    t = most
    while t >= 128:
        if dim % t == 0:
            return t
        t //= 2
    return dim


def megablox_row_tile(rows: int, groups: int) -> int:
    """The m tile for `rows` (a multiple of MEGABLOX_ROWS) sorted into `groups` groups. The
    kernel visits a tile once per group it holds, so each group boundary inside a tile costs
    a tile more: up to (groups - 1) x tile extra rows. The tile is the largest power of two
    <= 512 that divides `rows` and keeps that under a quarter of the rows (the pod's 128
    experts on 99,328 rows: 128, +16%; 512 would be +65%)."""
    t = 512
    while t > MEGABLOX_ROWS and (rows % t or (groups - 1) * t > rows // 4):
        t //= 2
    return t


def megablox_gmm(xs, w, counts, interpret: bool = False):
    """The Pallas megablox grouped matmul of `moe_ep._grouped` (rows padded with zero rows to a
    multiple of MEGABLOX_ROWS when they are not one already: the dropless capacity n x k).
    `interpret` runs the kernel in Pallas' interpreter (the CPU test)."""
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox
    rows = xs.shape[0]
    pad = -rows % MEGABLOX_ROWS
    if pad:  # the padded rows lie past sum(counts): outside every group, zero out
        xs = jnp.pad(xs, ((0, pad), (0, 0)))
    tiling = (megablox_row_tile(rows + pad, w.shape[0]), _tile(xs.shape[1], 1024),
              _tile(w.shape[2], 1024))
    out = megablox.gmm(xs, w, counts.astype(jnp.int32), xs.dtype, tiling, None, None,
                       False, interpret)
    return out[:rows] if pad else out
