"""The co-ordination gap of a config's environments: scripted reference organisations.

    python -m avalon.tools.env_baselines --config=configs/toy_org.py [--split=heldout] [--tasks=N]
        (the toy's three co-ordination environments: add --config.env.three_environments=True)
    python -m avalon.tools.env_baselines --config=... --by_tier     # each difficulty tier's

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

`--by_tier`: the same per difficulty tier (`avalon/envs/tiers.py`; an environment without tiers
is one), over each tier's first N tasks of the split, `{env: {tier: {policy: {"mean", "se",
"success", "success_se"}}}}`, where success is what the curriculum samplers read
(`train/org_metrics.success`: the environment's `success` metric, else reward > 0): which
tiers a model can reach, and how much an organisation adds at each.
"""

from __future__ import annotations

import json
import math

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from avalon import command
from avalon.envs.base import Split
from avalon.envs.tiers import tier_name, tier_task_ids
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.tokenizer.chat import ChatFormat
from avalon.tokenizer.hf import HFTokenizer
from avalon.train.config import TrainConfig, from_config_dict
from avalon.train.evaluation import eval_clock
from avalon.train.org_metrics import success
from avalon.train.setup import build_tokenizer


def mean_se(values) -> dict:
    """{"mean", "se"} of a list of floats (se = sample sd / sqrt(n); 0 for one value)."""
    x = np.asarray(values, np.float64)
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
    return {"mean": float(x.mean()), "se": se}


def collective(rollout) -> float:
    return float(sum(ev.value for ev in rollout.rewards))


def env_table(env, chat: ChatFormat, cfg: TrainConfig, split: Split, n_tasks: int,
              ids: tuple[str, ...] | None = None, with_success: bool = False) -> dict:
    """{policy: {"mean", "se"}} for one environment (see the module docstring), over `ids`
    (default: the split's first `n_tasks`); `with_success` adds "success" and "success_se"."""
    ids = (env.task_ids(split) if ids is None else ids)[:n_tasks]
    clock = eval_clock(cfg, env, ids[0])
    out = {}
    for name, make, budget in env.baselines(chat).policies():
        b = cfg.eval.budget if budget is None else budget
        groups = [GroupSpec(i, (RolloutSpec(env.session(t, seed=i, clock_s=clock), budget=b,
                                            seed=i),)) for i, t in enumerate(ids)]
        result = RolloutDriver(make(), chat, cfg.org).run(groups)
        rollouts = [g.rollouts[0] for g in result.groups]
        out[name] = mean_se([collective(r) for r in rollouts])
        if with_success:
            won = mean_se([success(r) for r in rollouts])
            out[name].update(success=won["mean"], success_se=won["se"])
    best = [env.optimum(t, clock, cfg.eval.budget) for t in ids]
    if all(v is not None for v in best):
        out["optimum"] = mean_se(best)
    return out


def run(config, split: Split, n_tasks: int, by_tier: bool = False) -> dict:
    """The whole table for a config (a ConfigDict as `get_config` returns it)."""
    mesh = dict(config.mesh.items())
    cfg = from_config_dict(config, num_devices=math.prod(mesh.values()))
    envs = list(cfg.make_environments(config.env))
    tok = build_tokenizer(cfg, envs)
    # a tokenizer with a chat template renders through its markup, as training does
    chat = ChatFormat(tok, tok.rendering if isinstance(tok, HFTokenizer) else None)
    if not by_tier:
        return {env.name: env_table(env, chat, cfg, split, n_tasks) for env in envs}
    return {env.name: {tier_name(t): env_table(env, chat, cfg, split, n_tasks, ids,
                                               with_success=True)
                       for t, ids in enumerate(tier_task_ids(env, split))} for env in envs}


def _define_flags():
    """The command line's flags, defined only when this file runs as a program: tests import
    `run` from here, and flags defined at import would collide with other tools' `--config`."""
    config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
    flags.DEFINE_enum("split", "heldout", ["train", "heldout"], "Which tasks.")
    flags.DEFINE_integer("tasks", 64, "Tasks per environment (the split's first N).")
    flags.DEFINE_bool("by_tier", False, "One table per difficulty tier (its first N tasks).")
    flags.mark_flags_as_required(["config"])


def main(argv):
    del argv  # absl_flags_parser refuses extra arguments
    f = flags.FLAGS
    if f.tasks < 1:
        raise command.Stop(f"--tasks={f.tasks}: must be >= 1")
    print(json.dumps(run(f.config, Split(f.split), f.tasks, by_tier=f.by_tier)))


if __name__ == "__main__":
    _define_flags()
    command.run("avalon.tools.env_baselines",
                lambda: app.run(main, flags_parser=command.absl_flags_parser(config=True)),
                interrupted="stopped; nothing was written: rerun the same command")
