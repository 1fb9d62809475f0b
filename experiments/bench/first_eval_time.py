"""The first evaluation against the next: where its post-compile time goes (the ETA's input).

    python -m experiments.bench.first_eval_time --init_from=RUN_DIR [--config=configs/toy_org.py]

Builds the trainer (`train.loop.prepare`, no SFT or RLCR steps, params from a trained run) and
its engine as the loop does (fresh programs' first runs reported to the compile clock,
`inference/first_run.py`), with no persistent compilation cache (every program compiles),
then runs the held-out evaluation twice in the one process. Prints one JSON line per
evaluation: wall seconds, JAX's compile events, the compile clock with the first-run spans,
the post-compile seconds the ETA extrapolates, the process CPU seconds, the first runs counted
and the load average. The second evaluation compiles nothing: it is the steady time the ETA
should forecast. Run it niced on a shared machine and read wall times against the load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(prog="experiments.bench.first_eval_time")
    parser.add_argument("--init_from", required=True, help="a trained run directory")
    parser.add_argument("--config", default="configs/toy_org.py")
    args = parser.parse_args()
    import jax

    from avalon.train import cpu_memory
    cpu_memory.keep_step_memory()
    from avalon.train import loop
    from avalon.train.telemetry import CompileClock

    spec = importlib.util.spec_from_file_location("run_config", args.config)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.unlock()
    config.init_from, config.sft.steps, config.rollout.steps = args.init_from, 0, 0
    job = loop.prepare(config, tempfile.mkdtemp(prefix="first-eval-"))
    clock = CompileClock.process()
    events = CompileClock()  # JAX's compile events alone
    jax.monitoring.register_event_time_span_listener(events._on_span)
    job.engine = job.make_engine()
    firsts: list[float] = []
    report = job.engine._run.on_first_run

    def counted(start: float, end: float) -> None:
        firsts.append(end - start)
        report(start, end)

    job.engine._run.on_first_run = counted
    for i in range(2):
        n, t, c, e, p = len(firsts), time.time(), clock(), events(), time.process_time()
        job._evaluate()
        wall, compiled = time.time() - t, clock() - c
        print(json.dumps({"eval": i, "wall_s": round(wall, 1),
                          "compile_events_s": round(events() - e, 1),
                          "compile_with_first_runs_s": round(compiled, 1),
                          "post_compile_s": round(wall - compiled, 1),
                          "cpu_s": round(time.process_time() - p, 1),
                          "first_runs": len(firsts) - n,
                          "load": [round(x, 1) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
