"""The report's baselines and the ones it lacked, as arms of the held-out evaluation (SPEC §5).

Each runs after `evaluation.evaluate`, on the same held-out tasks, through the same driver, and
logs its rollouts beside the evaluation's (an index `index-baselines.jsonl`, read by
`avalon/analysis/logs.py`), so `python -m avalon.analyze` puts them in the report:
- `eval.s8`: arm "s8". For every logged organisation rollout of this evaluation, one single
  agent on the same task whose submissions (final_message and the task's own submission tools)
  are refused with the "keep improving" message until it has written as many output tokens as
  that rollout did (`avalon/envs/keep_improving.py`). It samples with the single arm's seeds
  (the organisation rollout's seed + 1000: `eval_seeds.py`), so it differs from the
  single agent only by the refusals, and runs under `eval.s8_clock_s` (0: the evaluation clock
  x (1 + budget): time to write the organisation's tokens alone) with `OrgConfig.max_turns` x
  (1 + budget) turns (the turns the organisation's agents had together). Waiting with nothing
  in flight before the tokens are written wakes it with the refusal (`organisation.py`), so it
  ends at matched tokens, at its clock or at its turn cap. Needs `eval.log_events`.
- `eval.best_of_k = k`: arm "best_of_k", k independent single agents per task (extra `k`);
  the report scores it best-by-score and by majority vote over final answers.
- `eval.sweep_clocks`: arms "org@<clock>s" and "single@<clock>s", the evaluation's two arms
  with the same seeds under each clock (extra `clock_s`): a time-budget sweep of the checkpoint.
Every clock here is read as `eval.clock_s` is (`evaluation.eval_clock`): against the
curriculum's `clock.start_s`, scaling each environment's own clock, so one sweep spans
environments whose clocks differ.
Single-agent RL at matched compute is not an arm but a run (budget 0 throughout):
`configs/toy_baselines.py:single_rl`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from avalon.analysis.logs import IndexEntry, read_index, rollout_file, write_index
from avalon.envs.keep_improving import KeepImprovingSession
from avalon.org.config import OrgConfig
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.events import EventKind, read_jsonl
from avalon.train.eval_seeds import SINGLE_ARM_OFFSET, heldout_task_ids, rollout_seed
from avalon.train.org_metrics import rollout_metrics

_GROUP_BASE = 1_000_000  # baseline group ids never collide with the evaluation's
_BEST_OF_K_SEED = 30_000_000


@dataclasses.dataclass(frozen=True)
class _Arm:
    name: str
    spec: RolloutSpec
    env: str
    task_id: str
    extra: dict
    turns_scale: int = 1  # the arm's agents get OrgConfig.max_turns x this many turns


def enabled(eval_cfg) -> bool:
    return bool(eval_cfg.s8 or eval_cfg.best_of_k or eval_cfg.sweep_clocks)


def _scaled_clock(env, task_id: str, clock_s: float, clock_start_s: float) -> float:
    """`clock_s` read against the curriculum's start clock, on this environment's own clock."""
    return env.task(task_id).wall_clock_s * clock_s / clock_start_s


def _s8_arms(eval_cfg, envs, log_dir: str, clock_start_s: float) -> list[_Arm]:
    by_name = {e.name: e for e in envs}
    s8_clock = eval_cfg.s8_clock_s or eval_cfg.clock_s * (1 + eval_cfg.budget)
    out = []
    for entry in read_index(log_dir):
        if entry.arm != "org":
            continue
        events = read_jsonl(os.path.join(log_dir, entry.file))
        start = events[0]
        tokens = sum(int(e["n_out"]) for e in events if e["kind"] == EventKind.MODEL_CALL.value)
        env = by_name[entry.env]
        clock = _scaled_clock(env, start["task_id"], s8_clock, clock_start_s)
        session = KeepImprovingSession(
            env.session(start["task_id"], seed=int(entry.extra["seed_index"]), clock_s=clock),
            min_tokens_out=tokens)
        out.append(_Arm("s8", RolloutSpec(session, budget=0,
                                          seed=int(start["seed"]) + SINGLE_ARM_OFFSET),
                        entry.env, start["task_id"],
                        {"matched_tokens_out": tokens, "org_file": entry.file,
                         "clock_s": clock}, turns_scale=1 + eval_cfg.budget))
    return out


def _best_of_k_arms(eval_cfg, envs, clock_start_s: float) -> list[_Arm]:
    k, out = eval_cfg.best_of_k, []
    for env in envs:
        for t, task_id in enumerate(heldout_task_ids(env, eval_cfg)):
            clock = _scaled_clock(env, task_id, eval_cfg.clock_s, clock_start_s)
            for j in range(k):
                out.append(_Arm("best_of_k", RolloutSpec(
                    env.session(task_id, seed=j, clock_s=clock), budget=0,
                    seed=_BEST_OF_K_SEED + t * 1000 + j), env.name, task_id, {"k": k}))
    return out


def _sweep_arms(eval_cfg, envs, seed0: int, clock_start_s: float) -> list[_Arm]:
    out = []
    for sweep_clock in eval_cfg.sweep_clocks:
        for env in envs:
            for t, task_id in enumerate(heldout_task_ids(env, eval_cfg)):
                clock = _scaled_clock(env, task_id, sweep_clock, clock_start_s)
                for a, (arm, budget) in enumerate((("org", eval_cfg.budget), ("single", 0))):
                    for s in range(eval_cfg.seeds):
                        seed = rollout_seed(t, a, s, base=seed0)
                        out.append(_Arm(f"{arm}@{sweep_clock:g}s", RolloutSpec(
                            env.session(task_id, seed=s, clock_s=clock), budget=budget,
                            seed=seed), env.name, task_id, {"clock_s": clock}))
    return out


def baseline_arms(eval_cfg, envs, log_dir: str, *, eval_seed: int,
                  clock_start_s: float) -> list[_Arm]:
    """Every baseline rollout this evaluation config asks for (see the module docstring)."""
    arms = []
    if eval_cfg.s8:
        arms += _s8_arms(eval_cfg, envs, log_dir, clock_start_s)
    if eval_cfg.best_of_k:
        arms += _best_of_k_arms(eval_cfg, envs, clock_start_s)
    arms += _sweep_arms(eval_cfg, envs, eval_seed, clock_start_s)
    return arms


def run_baselines(eval_cfg, org_cfg: OrgConfig, envs: Sequence, chat, policy, *, slots: int,
                  log_dir: str, at_step: int, at_rl_step: int, eval_seed: int,
                  clock_start_s: float) -> dict:
    """Plays the baseline arms (one rollout per group; as many at once as `slots` holds) and
    returns `eval/<arm>_reward` and the rest of `org_metrics.rollout_metrics` per arm as
    `eval/<arm>/<metric>` (the evaluation's naming). `clock_start_s`: the curriculum's start
    clock, against which the evaluation's clocks are read."""
    arms = baseline_arms(eval_cfg, envs, log_dir, eval_seed=eval_seed,
                         clock_start_s=clock_start_s)
    index, groups_of = [], {}
    chunk: list[GroupSpec] = []
    used, scale = 0, 1

    def flush():
        nonlocal chunk, used
        if chunk:
            cfg = dataclasses.replace(org_cfg, max_turns=org_cfg.max_turns * scale)
            driver = RolloutDriver(policy, chat, cfg, log_dir=log_dir)
            for spec, g in zip(chunk, driver.run(chunk).groups):
                groups_of[spec.group_id] = g
        chunk, used = [], 0

    for i, arm in enumerate(arms):
        need = 1 + arm.spec.budget
        if used + need > slots or arm.turns_scale != scale:
            flush()
            scale = arm.turns_scale
        gid = _GROUP_BASE + i
        chunk.append(GroupSpec(group_id=gid, rollouts=(arm.spec,)))
        used += need
        index.append(IndexEntry(rollout_file(gid, 0), "eval", at_step, at_rl_step, arm.env,
                                arm.name, arm.extra))
    flush()
    write_index(log_dir, index, part="baselines")
    out = {}
    for name in dict.fromkeys(a.name for a in arms):
        groups = [groups_of[_GROUP_BASE + i] for i, a in enumerate(arms) if a.name == name]
        m = rollout_metrics(groups)
        out[f"eval/{name}_reward"] = m["reward/mean"]
        out.update({f"eval/{name}/{key.removeprefix('org/')}": v for key, v in m.items()})
    return out
