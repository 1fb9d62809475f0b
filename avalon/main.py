"""The main job: train an organisation.

    python -m avalon.main --config=configs/toy_org.py --workdir=runs/toy
    python -m avalon.main --config=configs/toy_org.py:smoke --workdir=/tmp/smoke \\
        --config.rollout.steps=5

Flags: `--config` (a config file, `:arg` passed to its `get_config`), `--config.x.y=value`
overrides (an unknown key stops at start-up), `--workdir` (checkpoints, metrics, plots; rerun
the same command to resume), multi-host start-up (`--coordinator`, `--num_processes`,
`--process_id`, or `AVALON_*` environment variables, or `--distributed_auto` on a TPU pod),
and `--jax_cache_dir` (a persistent compilation cache).
"""

from __future__ import annotations

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from avalon.train import cli, cpu_memory, distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (resumes if it has checkpoints).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-host).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_AUTO = flags.DEFINE_bool("distributed_auto", False,
                          "Let JAX detect the cluster (TPU pods, SLURM) when no flags are given.")
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "Persistent compilation cache directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax and XLA info lines drown the progress bar
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                           auto=_AUTO.value)
    if _CACHE.value:
        jax.config.update("jax_compilation_cache_dir", _CACHE.value)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    # Before JAX's CPU client starts: each step's temporaries stay mapped between steps.
    cpu_memory.keep_step_memory()
    from avalon.train import loop  # after distributed start-up: importing touches no backend
    try:
        job = loop.prepare(_CONFIG.value, _WORKDIR.value,
                           config_name=flags.FLAGS["config"].serialize().split("=", 1)[-1],
                           command=("python", "-m", "avalon.main", *sys.argv[1:]))
    except ValueError as e:  # a configuration problem: the message names the field
        sys.exit(f"avalon.main: {e}")
    job.run()


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, "avalon.main"))
