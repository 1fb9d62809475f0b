"""Evaluate a run's newest checkpoint again, with baselines (`avalon/train/checkpoint_eval.py`).

    python -m avalon.tools.evaluate --config=configs/toy_baselines.py:arms --workdir=runs/toy
    python -m avalon.analyze runs/toy

(any config whose eval section sets the baselines: `configs/toy_baselines.py:arms` is the toy's
with S8, best-of-4 and a clock sweep; `--config.eval.x=...` overrides its values).

prints the metrics as JSON; the rollouts' logs go under WORKDIR/events/eval/step<N>/.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The run directory (its newest checkpoint).")
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "Persistent compilation cache directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CACHE.value:
        import jax
        jax.config.update("jax_compilation_cache_dir", _CACHE.value)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from avalon.train.checkpoint_eval import evaluate_latest
    try:
        m = evaluate_latest(_CONFIG.value, _WORKDIR.value)
    except ValueError as e:
        sys.exit(f"avalon.tools.evaluate: {e}")
    print(json.dumps({k: v for k, v in m.items() if not isinstance(v, dict)}, indent=1,
                     sort_keys=True))


if __name__ == "__main__":
    from avalon.train import cli
    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, "avalon.tools.evaluate"))
