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

import importlib.util
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from avalon.train import distributed

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
    from avalon.train import loop  # after distributed start-up: importing touches no backend
    try:
        job = loop.prepare(_CONFIG.value, _WORKDIR.value,
                           config_name=flags.FLAGS["config"].serialize().split("=", 1)[-1],
                           command=("python", "-m", "avalon.main", *sys.argv[1:]))
    except ValueError as e:  # a configuration problem: the message names the field
        sys.exit(f"avalon.main: {e}")
    job.run()


def _config_file(argv) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_override(argv) -> str | None:
    """The first `--config.a.b=v` whose path the config file does not have."""
    path = _config_file(argv)
    if path is None:
        return None
    file, _, arg = path.partition(":")
    spec = importlib.util.spec_from_file_location("avalon_config_check", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for a in argv:
        if not a.startswith("--config."):
            continue
        node = config
        for key in a[len("--config."):].split("=", 1)[0].split("."):
            if not hasattr(node, "keys") or key not in node.keys():
                return a.split("=", 1)[0]
            node = node[key]
    return None


def _last_line(message: str) -> str:
    """The cause of an error whose message embeds a traceback (config_flags wraps exceptions
    raised inside `get_config` that way): its last non-empty line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else message


def parse_flags(argv):
    """absl flag parsing; every bad flag value ends the program with one line naming it."""
    path = _config_file(argv)
    if path is not None and not os.path.isfile(path.partition(":")[0]):
        sys.exit(f"avalon.main: --config={path}: no such config file")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        bad = _unknown_override(argv)
        if bad is None:
            raise
        hint = _last_line(str(e)) if "Did you mean" in str(e) else ""
        sys.exit(f"avalon.main: {bad}: no such key in the config (an override can only change a "
                 f"key the config file sets){'; ' + hint if hint else ''}")
    except flags.Error as e:  # a value absl could not parse, a config file that raised
        first = str(e).splitlines()[0] if str(e) else repr(e)
        head = first.split(": ", 1)[0].removeprefix("flag ")
        cause = _last_line(str(e))
        if cause == first:  # no traceback inside: absl's own one-line message
            cause = first.split(": ", 1)[-1]
        sys.exit(f"avalon.main: {head}: {cause.removeprefix('ValueError: ')}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
