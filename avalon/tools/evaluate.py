"""Evaluate a run's newest checkpoint again, with baselines (`avalon/train/checkpoint_eval.py`).

    python -m avalon.tools.evaluate --config=configs/toy_baselines.py:arms --workdir=runs/toy
    python -m avalon.analyze runs/toy

(any config whose eval section sets the baselines: `configs/toy_baselines.py:arms` is the toy's
with S8, best-of-4 and a clock sweep; `--config.eval.x=...` overrides its values).

prints the metrics as JSON; the rollouts' logs go under WORKDIR/events/eval/step<N>/. A progress
bar counts the evaluation's rollouts. Bad input and Ctrl-C end with one line
(`avalon/command.py`); `--verbose` shows library logging.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from avalon import command

PROG = "avalon.tools.evaluate"

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The run directory (its newest checkpoint).")
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "Persistent compilation cache directory "
                             "(default WORKDIR/cache/jax, the run's own; empty for none).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv  # absl_flags_parser refuses extra arguments
    import os

    import jax

    from avalon import paths
    workdir = _WORKDIR.value
    if not paths.is_remote(workdir) and not os.path.isdir(workdir):
        raise command.Stop(f"--workdir={workdir}: no such run directory; give a training "
                           "--workdir that holds checkpoints/")
    cache = paths.join(workdir, "cache", "jax") if _CACHE.value is None else _CACHE.value
    if cache:
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from avalon.train.checkpoint_eval import evaluate_latest
    m = evaluate_latest(_CONFIG.value, workdir,
                        progress=command.ProgressLine("evaluating", "rollouts"))
    print(json.dumps({k: v for k, v in m.items() if not isinstance(v, dict)}, indent=1,
                     sort_keys=True))


if __name__ == "__main__":
    command.run(PROG, lambda: app.run(main, flags_parser=command.absl_flags_parser(config=True)),
                interrupted="stopped; nothing was written to metrics.jsonl (some event logs "
                            "may be): rerun the same command to evaluate again")
