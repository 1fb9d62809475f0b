"""One side of `experiments/bench/rlcr_step.py`: RLCR steps of a config, driven over a pipe.

    python experiments/bench/rlcr_step_worker.py --config=configs/smol_org.py \
        --init_from=RUN --workdir=/tmp/w        # then "step" / "refs" / "quit" lines on stdin

Runs in the tree under test (`cwd` and `PYTHONPATH` set to it by the driver), so it uses only
what every measured commit has: `avalon.train.loop.prepare`, `Run._rl_step`, `Run.make_engine`,
`Run.switch_engine`, `Run.telemetry.path`, and `Engine._run(fn, *args, setup=...)`, through
which every device call of the engine goes; that one method is wrapped here to time each call
by kind (prefill, decode, state ops) and to count the rows each decode dispatch carried. With
JAX's CPU client executing on the calling thread (`cpu_memory.keep_step_memory`, as `avalon.main`
starts a run) a call's wall time is its device time; on an accelerator it is the time to issue
it and the rest shows up as waiting.

Each "step" line runs one RLCR step from the starting params (reset before every step, so
every step plays the same model and both sides of a comparison play the same one; the step
counter advances, so each step plays new tasks and seeds) and answers with one JSON line: the
step's `metrics.jsonl` record and the wrapped engine's split. "refs" measures the two
references the step is held against (the engine's decode at the step's live batch and context;
Avalon's SmolLM2 update step as `experiments.bench.vs_torch` times it) and answers the same way.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "the run config (and its overrides)")
flags.DEFINE_string("init_from", None, "the checkpoint every step starts from (a run directory)")
flags.DEFINE_string("workdir", None, "a scratch run directory")
flags.DEFINE_integer("decode_tokens", 64, "refs: tokens per row of the engine decode reference")
flags.DEFINE_bool("update_reference", True, "refs: also time vs_torch's SmolLM2 update step")
FLAGS = flags.FLAGS

# What a bench step leaves out of a run's step: SFT, evaluation, checkpoints, plots.
BENCH_OVERRIDES = {("sft", "steps"): 0, ("eval", "every"): 10**6,
                   ("checkpoint", "every"): 10**6, ("plots",): False,
                   ("rollout", "steps"): 10**6}


class EngineSplit:
    """Times every engine's `_run` calls by the function each runs; counts decode rows."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.decode_rows = self.decode_row_slots = 0
        self.decode_context = 0  # sum over live decode rows of their context length
        self.prefill_rows = self.prefill_row_slots = 0
        self.prefill_positions = 0  # rows x chunk length, padding included

    def install(self, engine_cls) -> None:
        """Wrap the `_run` of every engine made from now on (an attribute each engine sets in
        its constructor)."""
        init = engine_cls.__init__
        split = self

        def wrapped_init(engine, *args, **kwargs):
            init(engine, *args, **kwargs)
            engine._run = split._timed(engine, engine._run)

        engine_cls.__init__ = wrapped_init

    def _timed(self, engine, inner):
        split = self

        def timed(fn, *args, **kwargs):
            name = getattr(fn, "__name__", str(fn))
            t0 = time.perf_counter()
            out = inner(fn, *args, **kwargs)
            split.seconds[name] = split.seconds.get(name, 0.0) + time.perf_counter() - t0
            split.calls[name] = split.calls.get(name, 0) + 1
            if name in ("decode", "prefill"):
                idx = args[2]  # (params, state, idx, ...)
                live = [int(i) for i in idx if int(i) < engine.num_slots]
                if name == "decode":
                    split.decode_rows += len(live)
                    split.decode_row_slots += len(idx)
                    split.decode_context += int(sum(engine._lengths[i] for i in live))
                else:
                    split.prefill_rows += len(live)
                    split.prefill_row_slots += len(idx)
                    split.prefill_positions += int(args[4].shape[0] * args[4].shape[1])
            return out

        return timed

    def snapshot(self) -> dict:
        return json.loads(json.dumps(self.__dict__))


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = {n: x - before.get(k, {}).get(n, 0) for n, x in v.items()}
        else:
            out[k] = v - before.get(k, 0)
    return out


def _config():
    config = _CONFIG.value
    with config.unlocked():
        for path, value in BENCH_OVERRIDES.items():
            node = config
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        if FLAGS.init_from:
            config.init_from = FLAGS.init_from
    return config


class Worker:
    def __init__(self):
        import jax

        from avalon.inference.engine import Engine
        from avalon.train import loop, telemetry

        self.split = EngineSplit()
        self.split.install(Engine)
        self.clock = telemetry.CompileClock.process()
        t0 = time.perf_counter()
        self.run = loop.prepare(_config(), FLAGS.workdir)
        self.run.engine = self.run.make_engine()
        self.build_s = time.perf_counter() - t0
        self.shardings = jax.tree.map(lambda a: a.sharding, self.run.state)
        self.start = jax.device_get(self.run.state)  # every step starts from these
        self.live_rows: list[float] = []
        self.contexts: list[float] = []

    def _reset(self) -> None:
        import jax

        self.run.state = jax.tree.map(jax.device_put, self.start, self.shardings)
        self.run.switch_engine()

    def step(self) -> dict:
        from avalon.train.telemetry import read_metrics

        self._reset()
        engine = self.run.engine
        before, s0 = self.split.snapshot(), engine.stats.snapshot()
        c0, t0 = self.clock(), time.perf_counter()
        self.run._rl_step()
        wall, compile_s = time.perf_counter() - t0, self.clock() - c0
        split = _delta(self.split.snapshot(), before)
        stats = engine.stats
        record = read_metrics(self.run.telemetry.path)[-1]
        live = split["decode_rows"] / max(split["calls"].get("decode", 0), 1)
        context = split["decode_context"] / max(split["decode_rows"], 1)
        self.live_rows.append(live)
        self.contexts.append(context)
        return {"kind": "step", "wall_s": wall, "compile_s": compile_s, "record": record,
                "split": split, "live_rows_per_decode": live, "decode_context_mean": context,
                "prefill_tokens": stats.prefill_tokens - s0.prefill_tokens,
                "decode_tokens": stats.decode_tokens - s0.decode_tokens,
                "host_s": stats.host_seconds - s0.host_seconds,
                "device_wait_s": stats.device_wait_seconds - s0.device_wait_seconds,
                "max_rss_gb": _max_rss_gb()}

    def refs(self) -> dict:
        out = {"kind": "refs"}
        if self.live_rows:
            rows = max(1, round(statistics.median(self.live_rows)))
            context = int(statistics.median(self.contexts))
            out.update(engine_decode(self.run, rows, context, FLAGS.decode_tokens))
        if FLAGS.update_reference:
            out.update(reference_update())
        return out


def engine_decode(run, rows: int, context: int, tokens: int) -> dict:
    """The run's own engine decoding `rows` rows from a `context`-token prompt, `tokens` each,
    with no stop token: tokens/s of the decode alone (prefill not timed), median of 3."""
    import numpy as np

    from avalon.inference.api import SamplingParams, TurnRequest

    engine = run.engine
    if engine.suspended:
        engine.set_params(run.switch(run.state.params))
    rng = np.random.default_rng(0)
    vocab = run.cfg.model.vocab_size
    slots = [engine.allocate() for _ in range(rows)]
    context = min(context, run.cfg.org.window - 4 * tokens)
    times = []
    try:
        engine.generate([TurnRequest(s, rng.integers(0, vocab, context).astype(np.int32), 0)
                         for s in slots])
        for i in range(4):
            t0 = time.perf_counter()
            res = engine.generate([TurnRequest(s, np.zeros(0, np.int32), tokens,
                                               SamplingParams(temperature=1.0, seed=i * 97 + s))
                                   for s in slots])
            times.append((time.perf_counter() - t0, sum(len(r.tokens) for r in res)))
    finally:
        for s in slots:
            engine.release(s)
    measured = times[1:]  # the first may compile
    rate = statistics.median(n / t for t, n in measured)
    return {"engine_decode_rows": rows, "engine_decode_context": context,
            "engine_decode_tokens_per_s": rate}


def reference_update() -> dict:
    """Avalon's SmolLM2 update step as `experiments.bench.vs_torch --model=smollm2` times it
    (its defaults: CISPO, 2 x 1,024-token rows, lr 1e-5, flash attention, layers unrolled),
    median of 3 steps after a warm-up, on this process's CPUs."""
    import tempfile

    from experiments.bench import vs_torch as vt

    with tempfile.TemporaryDirectory(prefix="rlcr-ref-") as path:
        vt.build_smollm2(path)
        d = vt.MODEL_DEFAULTS["smollm2"]
        overrides = {"param_dtype": "float32", "scan_layers": False}
        from avalon.model.config import AttentionImpl
        overrides["attention_impl"] = AttentionImpl("flash")
        cfg, params = vt.load_avalon(path, overrides)
    import numpy as np
    arrays = vt.train_arrays(np.random.default_rng(0), cfg.vocab_size,
                             (d["train_batch"], d["train_seq"]), d["loss"])
    once = vt.avalon_update_once(cfg, params, arrays, d["lr"], d["loss"])
    wall = vt._median_time(once, 3)[0]
    return {"reference_update_tokens_per_s": d["train_batch"] * d["train_seq"] / wall,
            "reference_update_rows": [d["train_batch"], d["train_seq"]]}


def _max_rss_gb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv):
    del argv
    from avalon.train import cpu_memory

    cpu_memory.keep_step_memory()  # as avalon.main starts a run
    worker = Worker()
    print(json.dumps({"kind": "ready", "build_s": worker.build_s,
                      "tree": os.getcwd()}), flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "quit":
            break
        out = worker.step() if what == "step" else worker.refs() if what == "refs" else \
            {"kind": "error", "error": f"unknown command {what!r}"}
        print(json.dumps(out, default=float), flush=True)


if __name__ == "__main__":
    app.run(main)
