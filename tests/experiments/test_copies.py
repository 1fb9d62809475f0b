"""`experiments/bench/copies.py` finds the per-layer weight slices the stacked decode makes on
every token, and none in the engine's CPU default (one block per layer)."""

import jax

from avalon import model as M
from experiments.bench.copies import decode_copies


def test_unstacked_decode_slices_no_weights():
    cfg = M.presets.get("tiny", pattern="MEME", max_context=64)  # one scanned run, ME x 2
    params = M.init_params(jax.random.key(0), cfg)
    stacked = decode_copies(cfg, params, batch=8, context=32, backend="as_trained")
    default = decode_copies(cfg, params, batch=8, context=32)
    assert stacked["backend"] == "as_trained" and default["backend"] != "as_trained"
    assert stacked["weight_slice_ops"] > 0 and stacked["weight_slice_bytes"] > 0
    assert default["weight_slice_ops"] == 0 and default["weight_slice_bytes"] == 0
