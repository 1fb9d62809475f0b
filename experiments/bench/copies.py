"""Copies in the engine's compiled decode program: whole state leaves and per-layer weights.

`decode_copies(cfg, params, batch, context)` builds an `Engine` as a user would, lowers its
decode dispatch (`device.decode` with the engine's own setup and params) for `batch` rows and
reads the optimised HLO:
  state_leaf_copies   `copy` ops whose shape is a whole slot-state leaf (>= 3 dims): a donated,
                      in-place decode has none; each one re-reads and re-writes that leaf
  weight_slices       ops that materialise one layer's slice of a stacked weight (slice /
                      dynamic-slice, or a fusion named after them, of a per-layer shape of a
                      stacked leaf), with the bytes they write per execution; inside the decode
                      scan each runs once per token
Used by `vs_torch.py --count_copies`.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from avalon.inference import device as dev
from avalon.inference.engine import Engine
from avalon.inference.sampling import SamplingKnobs

_OP = re.compile(r"%([\w.-]+) = ([a-z0-9]+)\[([0-9,]*)\]\{[^}]*\} ([a-z-]+)\(")


def decode_copies(cfg, params, *, batch: int, context: int, **engine_kw) -> dict:
    engine = Engine(cfg, params, num_slots=batch, max_context=context, **engine_kw)
    setup, run_params = engine._setup, engine._run_params
    page = setup.page_size
    w = -(-context // page)
    state = dev.init_state(setup, batch, batch * w)
    knobs = SamplingKnobs(temperature=jnp.ones(batch), top_p=jnp.ones(batch),
                          top_k=jnp.zeros(batch, jnp.int32), greedy=jnp.ones(batch, bool),
                          seed=jnp.arange(batch, dtype=jnp.uint32))
    idx = jnp.arange(batch, dtype=jnp.int32)
    pages = jnp.arange(batch * w, dtype=jnp.int32).reshape(batch, w)
    stops = jnp.full((batch, 1), -1, jnp.int32)
    text = dev.decode.lower(run_params, state, idx, pages, knobs, stops,
                            setup=setup).compile().as_text()

    state_shapes = {",".join(map(str, x.shape)) for x in jax.tree.leaves(state) if x.ndim >= 3}
    # Per-layer slices of stacked weights (leaves of runs with more than one repeat).
    slice_bytes = {}
    for blk in run_params["blocks"]:
        for leaf in jax.tree.leaves(blk):
            if leaf.shape[0] > 1:
                key = ",".join(map(str, leaf.shape[1:]))
                slice_bytes[key] = int(np.prod(leaf.shape[1:])) * leaf.dtype.itemsize
    state_copies, weight_slices, weight_bytes = {}, 0, 0
    in_fusion = False  # inside a fused computation's body (its ops are counted at the call)
    for line in text.splitlines():
        if line.rstrip().endswith("{") and "=" not in line.split("(")[0]:
            header = line.split("(")[0]
            in_fusion = "fused" in header or "wrapped" in header
        m = _OP.search(line)
        if not m or in_fusion:
            continue
        name, shape, op = m.group(1), m.group(3), m.group(4)
        if op == "copy" and shape in state_shapes:
            state_copies[shape] = state_copies.get(shape, 0) + 1
        sliced = op in ("slice", "dynamic-slice") or (op == "fusion" and "slice" in name)
        shape = shape[2:] if shape.startswith("1,") and shape[2:] in slice_bytes else shape
        if sliced and shape in slice_bytes:
            weight_slices += 1
            weight_bytes += slice_bytes[shape]
    state_bytes = int(sum(x.nbytes for x in jax.tree.leaves(state)))
    return {"batch": batch, "backend": engine.backend.value,
            "state_leaf_copies": state_copies, "state_bytes": state_bytes,
            "weight_slice_ops": weight_slices, "weight_slice_bytes": weight_bytes}
