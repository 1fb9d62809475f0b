"""Batched decode throughput of the engine against its byte roofline.

    python experiments/bench/decode.py --preset=tiny --slots=8 --context=256          # CPU
    python experiments/bench/decode.py --preset=hybrid_2b_a06b --slots=256 --context=8192

Every slot starts at context - (tokens this script decodes) with a random cache (KV pages, conv
and fp32 SSM state), so it ends exactly at --context; each slot holds context / page_size pages
of the paged pool and its page table covers exactly --context positions. Attention reads every
page of the table each step (masked, not skipped), so the KV term of the byte count is the one
the device moves. Params are random (`init_params`); speed does not depend on their values.

Weights. By default the benchmark decodes with what the RL run decodes with: an fp32 master
(the trainer's, `param_dtype=float32` as in the RL configs) turned into the engine's bf16 decode
view by `avalon.inference.weights.DecodeView` (the per-step "switch"), whose time and bytes are
reported too. `--weights=preset` decodes the preset's own param dtype instead.

Two measurements:
  device  `--dispatches` back-to-back decode dispatches (each `--steps` tokens for every slot,
          one jitted scan, donated state, temperature-1 sampling), one block_until_ready at
          the end, after `--warmup` dispatches past compilation. Step time against the
          roofline max(bytes / 4.24 TB/s, FLOPs / 801 TFLOP/s) of performance.md (bytes from
          `avalon.model.accounting.decode_step_bytes`).
  engine  the same decode driven by `Engine.generate` (one turn per slot, empty new_tokens):
          host scheduling, result fetches and stop checks included; reports the host share.
Prints one JSON object. The roofline fraction is only meaningful on an H200.
"""

from __future__ import annotations

import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from avalon import model as M
from avalon.inference import device as dev
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.inference.sampling import SamplingKnobs
from avalon.inference.weights import DecodeView
from avalon.model import accounting

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "tiny", "model preset (avalon.model.presets)")
flags.DEFINE_integer("slots", 8, "decode slots (all active)")
flags.DEFINE_integer("context", 256, "context length each slot reaches (= KV capacity)")
flags.DEFINE_integer("steps", 8, "tokens per slot per dispatch (the scan length)")
flags.DEFINE_integer("dispatches", 8, "timed dispatches per measurement")
flags.DEFINE_integer("warmup", 2, "untimed dispatches first (compilation)")
flags.DEFINE_bool("engine", True, "also time the decode through Engine.generate")
flags.DEFINE_integer("page_size", 16, "KV positions per pool page")
flags.DEFINE_enum("weights", "decode_view", ["decode_view", "preset"],
                  "decode_view: an fp32 master cast to the engine's bf16 view (the RL run's "
                  "decode weights); preset: the preset's param dtype as is")
flags.DEFINE_bool("count_copies", False, "compile the decode program once more and count the "
                  "copy ops of whole state leaves in it (each one is extra HBM traffic)")


def random_state(setup: dev.Setup, slots: int, capacity: int, length: int, seed: int = 0):
    """A state with random contents, every slot `length` tokens long and holding
    capacity / page_size pool pages (slot s: pages [s * w, (s + 1) * w)), all sampling."""
    w = capacity // setup.page_size
    state = dev.init_state(setup, slots, slots * w)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    filled = [jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype) * 0.1
              if jnp.issubdtype(x.dtype, jnp.floating) else x for k, x in zip(keys, leaves)]
    state = jax.tree.unflatten(treedef, filled)
    cache = state.cache.replace(lengths=jnp.full((slots,), length, jnp.int32))
    return state.replace(cache=cache, live=jnp.ones(slots, bool),
                         remaining=jnp.full(slots, 1 << 30, jnp.int32))


def _decode_inputs(setup: dev.Setup, slots: int, capacity: int):
    """Every slot a row, temperature-1 sampling (the RL setting), no stop tokens."""
    knobs = SamplingKnobs(temperature=jnp.ones(slots), top_p=jnp.ones(slots),
                          top_k=jnp.zeros(slots, jnp.int32), greedy=jnp.zeros(slots, bool),
                          seed=jnp.arange(slots, dtype=jnp.uint32))
    stops = jnp.full((slots, 1), -1, jnp.int32)
    w = capacity // setup.page_size
    idx = jnp.arange(slots, dtype=jnp.int32)
    pages = jnp.arange(slots * w, dtype=jnp.int32).reshape(slots, w)
    return idx, pages, knobs, stops


def time_device(params, setup, state, slots: int, capacity: int, n: int, warmup: int):
    """Seconds per dispatch of `n` back-to-back decode dispatches; returns (seconds, state)."""
    idx, pages, knobs, stops = _decode_inputs(setup, slots, capacity)

    def run(state, count):
        for _ in range(count):
            state, _ = dev.decode(params, state, idx, pages, knobs, stops, setup=setup)
        return state

    state = run(state, warmup)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state = run(state, n)
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / n, state


def state_copies(params, setup, state, slots: int, capacity: int) -> dict:
    """Copy instructions in the compiled decode program whose shape is a whole state leaf.
    A donated, in-place decode has none; each one re-reads and re-writes that leaf."""
    idx, pages, knobs, stops = _decode_inputs(setup, slots, capacity)
    text = dev.decode.lower(params, state, idx, pages, knobs, stops,
                            setup=setup).compile().as_text()
    leaf_shapes = {",".join(map(str, x.shape)) for x in jax.tree.leaves(state) if x.ndim >= 3}
    counts = {}
    for line in text.splitlines():
        m = re.search(r"= [a-z0-9]+\[([0-9,]*)\]\{[^}]*\} copy\(", line)
        if m and m.group(1) in leaf_shapes:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def time_engine(cfg, params, state, slots: int, context: int, steps: int, n: int,
                warmup: int, start: int, page_size: int):
    # The stacked layout, as the device measurement (its state is installed as is).
    engine = Engine(cfg, params, num_slots=slots, max_context=context, steps_per_dispatch=steps,
                    page_size=page_size, unstack_layers=False)
    engine._install_state(state, np.full(slots, start))

    def turn(count):
        return [TurnRequest(s, np.zeros(0, np.int32), count * steps,
                            SamplingParams(temperature=1.0, seed=s)) for s in range(slots)]

    engine.generate(turn(warmup))
    before = engine.stats.snapshot()
    t0 = time.perf_counter()
    results = engine.generate(turn(n))
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results)
    host = engine.stats.host_seconds - before.host_seconds
    dispatches = engine.stats.dispatches - before.dispatches
    return {"engine_tokens_per_s": tokens / wall, "engine_dispatches": dispatches,
            "engine_ms_per_dispatch": 1e3 * wall / max(dispatches, 1),
            "host_ms_per_dispatch": 1e3 * host / max(dispatches, 1),
            "host_fraction": host / wall}


def main(argv):
    del argv
    cfg = M.presets.get(FLAGS.preset)
    slots, context, steps = FLAGS.slots, FLAGS.context, FLAGS.steps
    n, warmup = FLAGS.dispatches, FLAGS.warmup
    runs = (2 if FLAGS.engine else 1) * (n + warmup)
    start = context - steps * runs
    if start < 1:
        raise ValueError(f"--context={context} is too short for {runs} dispatches of "
                         f"{steps} tokens")
    if context % FLAGS.page_size:
        raise ValueError(f"--context={context} must be a multiple of --page_size")
    switch = None
    if FLAGS.weights == "decode_view":
        master = M.init_params(jax.random.key(0), cfg.replace(param_dtype="float32"))
        view = DecodeView(cfg)
        view(master)  # compile
        params = view(master)
        switch = {"switch_s": view.last_seconds, "decode_view_bytes": view.nbytes(),
                  "master_bytes": int(sum(x.nbytes for x in jax.tree.leaves(master)))}
        del master
    else:
        params = M.init_params(jax.random.key(0), cfg)
    setup = dev.Setup(cfg=cfg, mesh=None, max_context=context, steps=steps,
                      page_size=FLAGS.page_size)
    state = random_state(setup, slots, context, start)

    copies = state_copies(params, setup, state, slots, context) if FLAGS.count_copies else None
    per_dispatch, state = time_device(params, setup, state, slots, context, n, warmup)
    step_s = per_dispatch / steps
    nbytes = accounting.decode_step_bytes(cfg, slots, context)
    roofline_s = accounting.decode_roofline_s(cfg, slots, context)
    on_gpu = jax.default_backend() == "gpu"
    out = {
        "preset": FLAGS.preset, "slots": slots, "context": context, "steps_per_dispatch": steps,
        "dispatches": n, "device": jax.devices()[0].device_kind,
        "step_ms": 1e3 * step_s, "tokens_per_s": slots / step_s,
        "bytes_per_step": nbytes,
        "flops_per_step": accounting.decode_step_flops(cfg, slots, context),
        "h200_roofline_step_ms": 1e3 * roofline_s,
        "achieved_bytes_per_s": nbytes["total"] / step_s,
        "roofline_fraction": roofline_s / step_s if on_gpu else None,
        "state_leaf_copies": copies,
        "weights": FLAGS.weights, "weight_dtypes": sorted({str(x.dtype) for x in
                                                           jax.tree.leaves(params)}),
        "switch": switch,
        "note": None if on_gpu else "not a GPU: the H200 roofline fraction is not meaningful",
    }
    if FLAGS.engine:
        state_len = start + steps * (n + warmup)
        out.update(time_engine(cfg, params, state, slots, context, steps, n, warmup, state_len,
                               FLAGS.page_size))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    app.run(main)
