"""Evaluate a run's newest checkpoint again, with the baselines its config asks for: how a
time-budget sweep (`eval.sweep_clocks`), S8 or best-of-k is run on one trained checkpoint
without training further (`python -m avalon.tools.evaluate`).

The organisation and single-agent arms replay the evaluation's fixed seeds, so at the step the
training run already evaluated they reproduce its logs; the baselines' logs go beside them
(WORKDIR/events/eval/step<N>/), where `python -m avalon.analyze` finds them. Nothing is
appended to metrics.jsonl: the metrics are returned.
"""

from __future__ import annotations

from avalon import paths
from avalon.analysis.logs import step_dir
from avalon.org.engine_policy import EnginePolicy
from avalon.train import baselines, loop
from avalon.train.eval_seeds import EVAL_SEED
from avalon.train.evaluation import evaluate


def evaluate_latest(config, workdir: str, progress=None) -> dict:
    """The evaluation (and baseline) metrics of `workdir`'s newest checkpoint under `config`;
    `progress(done, total)` is called as the evaluation's rollouts end."""
    if not paths.join(workdir, "checkpoints").is_dir():
        raise ValueError(f"{workdir}: no checkpoints/ to evaluate")
    run = loop.prepare(config, workdir)
    try:
        if run.ckpt.latest_step() is None:
            raise ValueError(f"{workdir}: no checkpoint to evaluate")
        cfg, setup = run.cfg, run.setup
        engine = run.make_engine()  # decodes as the run did (engine.decode_dtype)
        log_dir = step_dir(workdir, "eval", run.host.step)
        m = evaluate(setup, engine, log_dir=log_dir, at_step=run.host.step,
                     at_rl_step=run.host.rl_step, progress=progress)
        if baselines.enabled(cfg.eval):
            m.update(baselines.run_baselines(
                cfg.eval, cfg.org, setup.envs, setup.chat,
                EnginePolicy(engine, setup.chat, cfg.sampling), slots=cfg.engine.slots,
                log_dir=log_dir, at_step=run.host.step, at_rl_step=run.host.rl_step,
                eval_seed=EVAL_SEED, clock_start_s=cfg.clock.start_s))
        return {"step": run.host.step, "rl_step": run.host.rl_step, **m}
    finally:
        run.ckpt.close()
        run.telemetry.close()
