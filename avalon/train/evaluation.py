"""Held-out evaluation: the organisation against a single agent on the same tasks.

For the first `eval.tasks` held-out tasks of every environment, `eval.seeds` sampled rollouts
with hire budget `eval.budget` (the organisation arm) and as many with budget 0 (the single
agent), all in one batched run through the engine. Each environment plays under its own clock
scaled as the curriculum scales it at `eval.clock_s` (`eval_clock`: the environment's default
clock times `eval.clock_s / clock.start_s`, so 1x when they are equal). Seeds are fixed per
(task, arm, seed index), so evaluations at different steps differ only by the policy.

Metrics: `eval/org_reward`, `eval/single_reward` (mean collective reward), and every metric of
`org_metrics.rollout_metrics` for each arm as `eval/org/<metric>` and `eval/single/<metric>`
(the training metric `org/hires_per_rollout` is `eval/org/hires_per_rollout` and
`eval/single/hires_per_rollout`; `reward/mean` is `eval/org/reward/mean`).
With `eval.log_events` (the default) every rollout's event log goes to
WORKDIR/events/eval/step<N>/ with an index (`avalon/analysis/logs.py`); the baselines
(`baselines.py`) run after it on the same tasks.
"""

from __future__ import annotations

import jax

from avalon.analysis.logs import IndexEntry, rollout_file, write_index
from avalon.envs.base import Environment
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.train import distributed, host_metrics
from avalon.train.eval_seeds import heldout_task_ids, rollout_seed
from avalon.train.org_metrics import rollout_sums
from avalon.train.setup import Setup


def eval_clock(cfg, env: Environment, task_id: str) -> float:
    """The wall clock of an environment's evaluation rollouts (see the module docstring)."""
    return env.task(task_id).wall_clock_s * cfg.eval.clock_s / cfg.clock.start_s


def arm_sums(groups, arm: str) -> dict:
    """`rollout_sums` of one arm under `eval/<arm>/...`, plus `eval/<arm>_reward`: one
    process's part of the arm's metrics (`host_metrics`)."""
    m = rollout_sums(groups)
    out = {f"eval/{arm}_reward": m["reward/mean"], f"eval/{arm}_reward/std": m["reward/std"],
           f"eval/{arm}_rollouts": sum(len(g.rollouts) for g in groups)}
    for key, value in m.items():
        out[f"eval/{arm}/{key.removeprefix('org/')}"] = value
    return out


def arm_metrics(groups, arm: str) -> dict:
    """The metrics of one arm's `groups`, as one process playing them all logs them."""
    return host_metrics.finish(arm_sums(groups, arm))


def pooled_arms(groups_of: dict[str, list]) -> dict:
    """Every arm's metrics over every process's rollouts: each process passes the groups it
    played per arm (none for an arm it did not play) and every process gets the same record
    (`host_metrics.reduce_across_hosts`; each measure's sums are added across processes
    before dividing, so the record is the report's on the union of the evaluation's logs)."""
    out = {}
    for arm, groups in groups_of.items():
        if groups:  # a process with no task of its own reports nothing
            out.update(arm_sums(groups, arm))
    rollouts = sum(len(g.rollouts) for g in groups_of.get("org", []))
    return host_metrics.reduce_across_hosts(out, weight=rollouts)


def evaluate(setup: Setup, engine, *, log_dir: str | None = None, at_step: int = 0,
             at_rl_step: int = 0, progress=None) -> dict:
    # progress(done, total): called as this process's evaluation rollouts end (a progress bar).
    """The evaluation's metrics; with `log_dir`, every rollout's event log and an index
    (`avalon/analysis/logs.py`) go there, marked as played at global step `at_step`.

    With several processes each plays its share of the held-out tasks (both arms of a task on
    one process: `distributed.host_shard`), writes its own logs and index part, and the
    metrics are reduced across processes (`pooled_arms`): every process returns the same
    record, the one a single process playing every task would log."""
    cfg = setup.cfg
    policy = EnginePolicy(engine, setup.chat, cfg.sampling)
    driver = RolloutDriver(policy, setup.chat, cfg.org, log_dir=log_dir,
                           continuous=cfg.engine.continuous)
    arms = (("org", cfg.eval.budget), ("single", 0))
    # As many tasks at once as the engine has slots for (both arms of a task together).
    per_task = cfg.eval.seeds * (2 + cfg.eval.budget)
    tasks_per_run = max(1, cfg.engine.slots // per_task)
    tasks = []  # per held-out task: [(arm, spec, index entries)] for both arms
    gid = 0
    for env in setup.envs:
        for t_index, task_id in enumerate(heldout_task_ids(env, cfg.eval)):
            clock = eval_clock(cfg, env, task_id)
            pair = []
            for a_index, (arm, budget) in enumerate(arms):
                rollouts = tuple(
                    RolloutSpec(env.session(task_id, seed=s, clock_s=clock), budget=budget,
                                seed=rollout_seed(t_index, a_index, s))
                    for s in range(cfg.eval.seeds))
                pair.append((arm, GroupSpec(group_id=gid, rollouts=rollouts),
                             [IndexEntry(rollout_file(gid, i), "eval", at_step, at_rl_step,
                                         env.name, arm, {"seed_index": i})
                              for i in range(len(rollouts))]))
                gid += 1
            tasks.append(pair)
    info = distributed.ProcessInfo(jax.process_index(), jax.process_count())
    mine = [x for pair in distributed.host_shard(tasks, info) for x in pair]
    specs = [spec for _, spec, _ in mine]
    groups_done = []
    step = tasks_per_run * len(arms)
    total = sum(len(s.rollouts) for s in specs)
    for start in range(0, len(specs), step):
        before = sum(len(g.rollouts) for g in groups_done)
        driver.progress = None if progress is None else (
            lambda done, _, before=before: progress(before + done, total))
        groups_done += driver.run(specs[start:start + step]).groups
    if log_dir is not None:
        write_index(log_dir, [e for _, _, entries in mine for e in entries],
                    part=f"p{info.process_id}" if info.process_id else "")
    return pooled_arms({arm: [g for g, (a, _, _) in zip(groups_done, mine) if a == arm]
                        for arm, _ in arms})
