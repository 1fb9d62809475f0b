"""The main job: train an organisation.

    python -m avalon.main --config=configs/toy_org.py --workdir=runs/toy
    python -m avalon.main --config=configs/toy_org.py:smoke --workdir=/tmp/smoke \\
        --config.rollout.steps=5

Flags: `--config` (a config file, `:arg` passed to its `get_config`), `--config.x.y=value`
overrides (an unknown key stops at start-up), `--workdir` (checkpoints, metrics, plots; rerun
the same command to resume: a config that differs from the one the workdir ran with, in more
than `avalon.train.config_history.RESUME_FIELDS` such as `rollout.steps`, is refused unless
`--config.allow_config_change` is given, and then recorded in WORKDIR/config_history.jsonl,
which also keeps every start's code: its git commit, for `avalon.analyze`),
multi-host start-up (`--coordinator`, `--num_processes`, `--process_id`, or `AVALON_*`
environment variables, or `--distributed_auto` on a TPU pod), `--jax_cache_dir` (the persistent
compilation cache; default WORKDIR/cache/jax, so a resumed run loads its programs instead of
compiling them again; `--jax_cache_dir=` for none) and `--verbose` (library logging). Bad input
and Ctrl-C end with one line (`avalon/command.py`).
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from avalon import command

PROG = "avalon.main"
ALLOW_CHANGE = "--config.allow_config_change"

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (resumes if it has checkpoints).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-host).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_AUTO = flags.DEFINE_bool("distributed_auto", False,
                          "Let JAX detect the cluster (TPU pods, SLURM) when no flags are given.")
_CACHE = flags.DEFINE_string("jax_cache_dir", None, "Persistent compilation cache directory "
                             "(default WORKDIR/cache/jax; empty for none).")
_ALLOW = flags.DEFINE_bool("allow_config_change", False,
                           f"Resume with a changed config (also spelt {ALLOW_CHANGE}).")
flags.mark_flags_as_required(["config", "workdir"])

_job = None  # the run, once built: what Ctrl-C reports


def check_workdir(workdir: str) -> None:
    """A local workdir must be a directory this process can write (new or a run's): probed
    here, before anything is built, so a bad one costs a second, not a compile."""
    from avalon import paths
    if paths.is_remote(workdir):
        return
    import os
    import tempfile
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise command.Stop(f"--workdir={workdir}: is a file; give a directory (a new one, or "
                           "a run's to resume it)")
    probe = workdir
    while not os.path.exists(probe):  # a new workdir: where it would be made
        probe = os.path.dirname(os.path.abspath(probe))
    try:
        if not os.path.isdir(probe):
            raise NotADirectoryError(20, "Not a directory", probe)
        tempfile.TemporaryDirectory(dir=probe).cleanup()  # nothing is left behind
    except OSError as e:
        raise command.Stop(f"--workdir={workdir}: cannot write there ({e.strerror or e}); "
                           "choose a directory you can write") from None


def main(argv):
    del argv  # absl_flags_parser refuses extra arguments
    import jax

    from avalon import paths
    from avalon.train import cpu_memory, distributed

    workdir = _WORKDIR.value
    check_workdir(workdir)
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                           auto=_AUTO.value)
    cache = paths.join(workdir, "cache", "jax") if _CACHE.value is None else _CACHE.value
    if cache:
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    # Before JAX's CPU client starts: each step's temporaries stay mapped between steps.
    cpu_memory.keep_step_memory()
    from avalon.train import loop  # after distributed start-up: importing touches no backend
    global _job
    _job = loop.prepare(_CONFIG.value, workdir,
                        config_name=flags.FLAGS["config"].serialize().split("=", 1)[-1],
                        command=("python", "-m", PROG, *sys.argv[1:]),
                        check_resume=True, allow_config_change=_ALLOW.value)
    _job.run()


def interrupted() -> str:
    """What Ctrl-C says: the step it stopped at, and that rerunning resumes (after any
    checkpoint being written has landed)."""
    if _job is None:
        return "stopped before training started; rerun the same command to start"
    _job.telemetry.progress.close()  # end the progress line
    try:
        _job.ckpt.wait()  # a checkpoint being written lands first
    except (KeyboardInterrupt, Exception):  # a second Ctrl-C, or a checkpointer torn down
        pass
    try:
        saved = _job.ckpt.latest_step()
    except Exception:
        saved = None
    where = (f"from its checkpoint at step {saved}" if saved is not None
             else "from the start: no checkpoint was written yet")
    return (f"stopped at step {_job.host.step}; rerun the same command to resume "
            f"({where})")


def _parse(argv):
    # `--config.allow_config_change` reads as a config override but is a flag of this program.
    argv = ["--allow_config_change" if a in (ALLOW_CHANGE, ALLOW_CHANGE + "=True",
                                             ALLOW_CHANGE + "=true") else a for a in argv]
    sys.argv[1:] = argv[1:]  # ml_collections reads the `--config.` overrides from sys.argv
    return command.absl_flags_parser(config=True)(argv)


if __name__ == "__main__":
    command.run(PROG, lambda: app.run(main, flags_parser=_parse), interrupted=interrupted)
