"""Useful generated tokens/s: continuous batching against tick batching, side by side.

    python -m experiments.bench.continuous_batching                       # toy model, CPU
    python -m experiments.bench.continuous_batching --agents=32 --repeats=5

The workload is an organisation's: `--agents` agents each play `--turns` turns; a turn appends
an observation of 8-64 tokens and samples a reply whose length is drawn log-uniformly from
[--min_len, --max_len] (8-512 by default: organisation turns range from a tool call to a
report). Replies are sampled at temperature 1 without stop tokens, so every reply has its drawn
length and both modes generate exactly the same tokens' worth of work.

  tick        `Engine.generate` per tick: every agent's turn t together, and no agent starts
              turn t + 1 before the slowest turn t ended (today's driver: one generate per tick).
  continuous  `Engine.submit` / `Engine.step`: an agent's next turn is handed over as soon as
              its previous one returns, joining the running dispatches.

Both run on one engine (same compiled programs), after two untimed warm-ups of each; timed
repeats alternate A/B so machine load (this machine is shared) hits both alike. Prints one JSON
object: tokens/s per repeat and mode, medians, and their ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import numpy as np
from absl import app, flags

from avalon import model as M
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.model.config import MoeBackend

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "toy", "model preset (avalon.model.presets)")
flags.DEFINE_integer("agents", 16, "agents (engine slots) playing at once")
flags.DEFINE_integer("turns", 4, "turns per agent")
flags.DEFINE_integer("min_len", 8, "shortest reply (tokens)")
flags.DEFINE_integer("max_len", 512, "longest reply (tokens)")
flags.DEFINE_integer("steps", 8, "tokens per decode dispatch")
flags.DEFINE_integer("max_context", 4096, "engine context window")
flags.DEFINE_integer("repeats", 3, "timed repeats per mode (interleaved)")
flags.DEFINE_integer("seed", 0, "workload seed")
flags.DEFINE_list("modes", ["tick", "continuous"], "modes to time (tick needs only "
                  "Engine.generate, so this file also drives the engine before continuous "
                  "batching: "
                  "continuous_vs_pre16.py)")
flags.DEFINE_integer("warmups", 2, "untimed runs of each mode first")
flags.DEFINE_string("moe_backend", "capacity_buckets", "the model's MoE backend, pinned so "
                    "engines of different commits run the same model")


def workload(cfg, agents: int, turns: int, lo: int, hi: int, seed: int):
    """Per agent, per turn: (observation tokens, reply length)."""
    rng = np.random.default_rng(seed)
    lens = np.exp(rng.uniform(np.log(lo), np.log(hi), (agents, turns))).round().astype(int)
    obs = rng.integers(8, 65, (agents, turns))
    return [[(rng.integers(0, cfg.vocab_size, obs[a, t]).astype(np.int32), int(lens[a, t]))
             for t in range(turns)] for a in range(agents)]


def _request(slot: int, agent: int, turn) -> TurnRequest:
    tokens, n = turn
    return TurnRequest(slot, tokens, n, SamplingParams(temperature=1.0, seed=agent))


def run_tick(engine: Engine, work) -> tuple[int, float]:
    slots = [engine.allocate() for _ in work]
    t0 = time.perf_counter()
    tokens = 0
    for t in range(len(work[0])):
        results = engine.generate([_request(s, a, work[a][t]) for a, s in enumerate(slots)])
        tokens += sum(len(r.tokens) for r in results)
    wall = time.perf_counter() - t0
    for s in slots:
        engine.release(s)
    return tokens, wall


def run_continuous(engine: Engine, work) -> tuple[int, float]:
    slots = [engine.allocate() for _ in work]
    agent_of = {s: a for a, s in enumerate(slots)}
    next_turn = [1] * len(work)
    t0 = time.perf_counter()
    engine.submit([_request(s, a, work[a][0]) for a, s in enumerate(slots)])
    tokens = 0
    while engine.busy:
        ready = []
        for res in engine.step():
            tokens += len(res.tokens)
            a = agent_of[res.slot]
            if next_turn[a] < len(work[a]):
                ready.append(_request(res.slot, a, work[a][next_turn[a]]))
                next_turn[a] += 1
        if ready:
            engine.submit(ready)
    wall = time.perf_counter() - t0
    for s in slots:
        engine.release(s)
    return tokens, wall


def main(argv):
    del argv
    cfg = M.presets.get(FLAGS.preset)
    cfg = cfg.replace(max_context=max(cfg.max_context, FLAGS.max_context),
                      moe_backend=MoeBackend(FLAGS.moe_backend))
    params = M.init_params(jax.random.key(0), cfg)
    engine = Engine(cfg, params, num_slots=FLAGS.agents, max_context=FLAGS.max_context,
                    steps_per_dispatch=FLAGS.steps)
    work = workload(cfg, FLAGS.agents, FLAGS.turns, FLAGS.min_len, FLAGS.max_len, FLAGS.seed)
    known = {"tick": run_tick, "continuous": run_continuous}
    for m in FLAGS.modes:
        if m not in known:
            raise ValueError(f"--modes: {m!r} is not one of {list(known)}")
    modes = {m: known[m] for m in FLAGS.modes}
    for _ in range(FLAGS.warmups):  # grow the KV pool, then compile every bucket the modes use
        for run in modes.values():
            run(engine, work)
    rates = {m: [] for m in modes}
    dispatches = {m: [] for m in modes}
    for _ in range(FLAGS.repeats):
        for name, run in modes.items():
            before = engine.stats.snapshot()
            tokens, wall = run(engine, work)
            rates[name].append(tokens / wall)
            dispatches[name].append(engine.stats.decode_dispatches - before.decode_dispatches)
    median = {m: statistics.median(r) for m, r in rates.items()}
    print(json.dumps({
        "preset": FLAGS.preset, "agents": FLAGS.agents, "turns": FLAGS.turns,
        "reply_len": [FLAGS.min_len, FLAGS.max_len], "steps_per_dispatch": FLAGS.steps,
        "generated_tokens": int(sum(n for agent in work for _, n in agent)),
        "device": jax.devices()[0].device_kind,
        "tokens_per_s": rates, "decode_dispatches": dispatches,
        "median_tokens_per_s": median,
        "continuous_over_tick": median["continuous"] / median["tick"]
        if {"tick", "continuous"} <= set(median) else None,
        "avalon": os.path.dirname(M.__file__),
    }, indent=1))


if __name__ == "__main__":
    app.run(main)
