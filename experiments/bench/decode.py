"""Batched decode throughput of the engine against its byte roofline.

    python -m experiments.bench.decode --config=configs/toy_org.py --slots=64 --context=512
    python -m experiments.bench.decode --config=configs/gpu_hybrid_2b.py --slots=256 \
        --context=8192
    python -m experiments.bench.decode --preset=tiny --slots=8 --context=256          # CPU

Every slot starts at context - (tokens this script decodes) with a random cache (KV pages, conv
and fp32 SSM state), so it ends exactly at --context; each slot holds context / page_size pages
of the paged pool and its page table covers exactly --context positions. Attention reads every
page of the table each step (masked, not skipped), so the KV term of the byte count is the one
the device moves. Params are random (`init_params`); speed does not depend on their values.

Weights: what the RL run decodes with. With `--config=` the model is the config's and the
weights are its fp32 master turned into the engine's decode view in the config's
`engine.decode_dtype` (`avalon.inference.weights.DecodeView`, what the run's `Switch` does
every step: bf16 matrices on the accelerator configs, the master itself on the CPU toy), and
the switch's time and bytes are reported too; `--config.engine.decode_dtype=...` overrides it.
Without `--config`, `--preset` and `--decode_dtype` (default bfloat16) say the same by hand.

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
from ml_collections import config_flags

from avalon import model as M
from avalon.inference import device as dev
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.inference.sampling import SamplingKnobs
from avalon.inference.weights import DecodeView
from avalon.model import accounting
from avalon.train.config import DECODE_DTYPES, EngineConfig, build_dataclass, model_config

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "a run config (configs/*.py): its model and "
                                "engine.decode_dtype (then --preset/--decode_dtype are unused)")
flags.DEFINE_string("preset", "tiny", "model preset (avalon.model.presets), without --config")
flags.DEFINE_enum("decode_dtype", None, list(DECODE_DTYPES), "decode weights, without --config "
                  "(default bfloat16)")
flags.DEFINE_integer("slots", 8, "decode slots (all active)")
flags.DEFINE_integer("context", 256, "context length each slot reaches (= KV capacity)")
flags.DEFINE_integer("steps", 8, "tokens per slot per dispatch (the scan length)")
flags.DEFINE_integer("dispatches", 8, "timed dispatches per measurement")
flags.DEFINE_integer("warmup", 2, "untimed dispatches first (compilation)")
flags.DEFINE_bool("engine", True, "also time the decode through Engine.generate")
flags.DEFINE_integer("page_size", 16, "KV positions per pool page")
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
                    page_size=page_size, backend="as_trained")
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


def model_and_dtype():
    """(model config, decode dtype, what they came from) per --config or --preset."""
    if FLAGS.config is None:
        dtype = FLAGS.decode_dtype or "bfloat16"
        return M.presets.get(FLAGS.preset), dtype, {"preset": FLAGS.preset}
    if FLAGS["decode_dtype"].present or FLAGS["preset"].present:
        raise ValueError("--preset/--decode_dtype are for runs without --config; override the "
                         "config instead (--config.engine.decode_dtype=float32)")
    engine = build_dataclass(EngineConfig, FLAGS.config.engine, "engine")
    return model_config(FLAGS.config.model), engine.decode_dtype, \
        {"config": config_flags.get_config_filename(FLAGS["config"]),
         "preset": FLAGS.config.model.preset}


def main(argv):
    del argv
    cfg, decode_dtype, source = model_and_dtype()
    slots, context, steps = FLAGS.slots, FLAGS.context, FLAGS.steps
    n, warmup = FLAGS.dispatches, FLAGS.warmup
    runs = (2 if FLAGS.engine else 1) * (n + warmup)
    start = context - steps * runs
    if start < 1:
        raise ValueError(f"--context={context} is too short for {runs} dispatches of "
                         f"{steps} tokens")
    if context % FLAGS.page_size:
        raise ValueError(f"--context={context} must be a multiple of --page_size")
    # The trainer's master (fp32, as the RL configs keep it) and the view the engine decodes.
    cfg = cfg.replace(param_dtype="float32")
    master = M.init_params(jax.random.key(0), cfg)
    view = DecodeView(cfg, dtype=decode_dtype)
    view(master)  # compile
    params = view(master)
    switch = {"switch_s": view.last_seconds,
              "switch_bytes_written": 0 if view.identity else view.nbytes(),
              "master_bytes": int(sum(x.nbytes for x in jax.tree.leaves(master)))}
    del master
    setup = dev.Setup(cfg=cfg, mesh=None, max_context=context, steps=steps,
                      page_size=FLAGS.page_size)
    state = random_state(setup, slots, context, start)

    copies = state_copies(params, setup, state, slots, context) if FLAGS.count_copies else None
    per_dispatch, state = time_device(params, setup, state, slots, context, n, warmup)
    step_s = per_dispatch / steps
    decoded = cfg.replace(param_dtype=decode_dtype)  # the weights streamed per step
    nbytes = accounting.decode_step_bytes(decoded, slots, context)
    roofline_s = accounting.decode_roofline_s(decoded, slots, context)
    on_gpu = jax.default_backend() == "gpu"
    out = {
        **source, "slots": slots, "context": context, "steps_per_dispatch": steps,
        "dispatches": n, "device": jax.devices()[0].device_kind,
        "step_ms": 1e3 * step_s, "tokens_per_s": slots / step_s,
        "bytes_per_step": nbytes,
        "flops_per_step": accounting.decode_step_flops(cfg, slots, context),
        "h200_roofline_step_ms": 1e3 * roofline_s,
        "achieved_bytes_per_s": nbytes["total"] / step_s,
        "roofline_fraction": roofline_s / step_s if on_gpu else None,
        "state_leaf_copies": copies,
        "decode_dtype": decode_dtype,
        "weight_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(params)}),
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
