"""The co-ordination gap of a config's environments: scripted reference organisations.

    python -m avalon.tools.env_baselines --config=configs/toy_org.py [--split=heldout] [--tasks=N]
        (the toy's three co-ordination environments: add --config.env.three_environments=True)

Prints one JSON object `{env_name: {policy: {"mean": m, "se": s}}}`: the mean collective reward
(the sum of reward events; for GKPO environments these include the final utility) over the
split's first N tasks, one rollout each, and its standard error, for every environment's
`Baselines` (`avalon/envs/teacher.py`): `chance`, `single` (b = 0), `org_silent` and `org` (at
the config's `eval.budget`), and `optimum` where the environment computes one. Every rollout
runs through the real organisation driver with the config's organisation settings and
tokenizer, under the clock evaluation gives each environment (its own clock scaled by
`eval.clock_s / clock.start_s`, `avalon/train/evaluation.py`). An environment meant to teach
co-ordination must show `org` clearly above `org_silent` and `single`. Bad input and Ctrl-C end
with one line (`avalon/command.py`).
"""

from __future__ import annotations

import json
import math

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from avalon import command
from avalon.envs.base import Split
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.tokenizer.chat import ChatFormat
from avalon.train.config import TrainConfig, from_config_dict
from avalon.train.evaluation import eval_clock
from avalon.train.setup import build_tokenizer


def mean_se(values) -> dict:
    """{"mean", "se"} of a list of floats (se = sample sd / sqrt(n); 0 for one value)."""
    x = np.asarray(values, np.float64)
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
    return {"mean": float(x.mean()), "se": se}


def collective(rollout) -> float:
    return float(sum(ev.value for ev in rollout.rewards))


def env_table(env, chat: ChatFormat, cfg: TrainConfig, split: Split, n_tasks: int) -> dict:
    """{policy: {"mean", "se"}} for one environment (see the module docstring)."""
    ids = env.task_ids(split)[:n_tasks]
    clock = eval_clock(cfg, env, ids[0])
    out = {}
    for name, make, budget in env.baselines(chat).policies():
        b = cfg.eval.budget if budget is None else budget
        groups = [GroupSpec(i, (RolloutSpec(env.session(t, seed=i, clock_s=clock), budget=b,
                                            seed=i),)) for i, t in enumerate(ids)]
        result = RolloutDriver(make(), chat, cfg.org).run(groups)
        out[name] = mean_se([collective(g.rollouts[0]) for g in result.groups])
    best = [env.optimum(t, clock, cfg.eval.budget) for t in ids]
    if all(v is not None for v in best):
        out["optimum"] = mean_se(best)
    return out


def run(config, split: Split, n_tasks: int) -> dict:
    """The whole table for a config (a ConfigDict as `get_config` returns it)."""
    mesh = dict(config.mesh.items())
    cfg = from_config_dict(config, num_devices=math.prod(mesh.values()))
    envs = list(cfg.make_environments(config.env))
    chat = ChatFormat(build_tokenizer(cfg, envs))
    return {env.name: env_table(env, chat, cfg, split, n_tasks) for env in envs}


def _define_flags():
    """The command line's flags, defined only when this file runs as a program: tests import
    `run` from here, and flags defined at import would collide with other tools' `--config`."""
    config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
    flags.DEFINE_enum("split", "heldout", ["train", "heldout"], "Which tasks.")
    flags.DEFINE_integer("tasks", 64, "Tasks per environment (the split's first N).")
    flags.mark_flags_as_required(["config"])


def main(argv):
    del argv  # absl_flags_parser refuses extra arguments
    f = flags.FLAGS
    if f.tasks < 1:
        raise command.Stop(f"--tasks={f.tasks}: must be >= 1")
    print(json.dumps(run(f.config, Split(f.split), f.tasks)))


if __name__ == "__main__":
    _define_flags()
    command.run("avalon.tools.env_baselines",
                lambda: app.run(main, flags_parser=command.absl_flags_parser(config=True)),
                interrupted="stopped; nothing was written: rerun the same command")
