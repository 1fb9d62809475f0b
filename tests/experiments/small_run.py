"""A small run directory played by real organisations, for the bench scripts' tests: held-out
evaluations of collective verification by the scripted teacher through the rollout driver,
logged as the training loop logs them (event files, index, and `metrics.jsonl` from the loop's
own `arm_metrics` on the in-memory rollouts)."""

from __future__ import annotations

import json

from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
from avalon.envs.base import Split
from avalon.envs.verification import Verification, VerificationConfig, VerifyTeacherConfig
from avalon.org.config import OrgConfig, PromptStyle
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.train.evaluation import arm_metrics
from tests.envs.helpers import word_chat

ENV = Verification(VerificationConfig(n_train=8, n_heldout=6))
SEEDS = 2


def evaluate(workdir, step: int, rl_step: int, verifier_rate: float) -> None:
    """One evaluation as `avalon/train/evaluation.py` plays it: per task, an org arm (budget
    3) and a single arm (budget 0) of SEEDS rollouts each, seeds fixed per task, arm, seed;
    the teacher's CEO hires a verifier in `verifier_rate` of its teams."""
    chat = word_chat(ENV)
    policy = ENV.teacher(chat, VerifyTeacherConfig(verifier_rate=verifier_rate,
                                                   hires_per_turn=1))
    log_dir = step_dir(workdir, "eval", step)
    specs, arm_of, index = [], [], []
    for t, task in enumerate(ENV.task_ids(Split.HELDOUT)):
        for a, (arm, budget) in enumerate((("org", 3), ("single", 0))):
            gid = len(specs)
            specs.append(GroupSpec(gid, tuple(
                RolloutSpec(ENV.session(task, seed=s), budget, seed=(t * 2 + a) * 100 + s)
                for s in range(SEEDS))))
            arm_of.append(arm)
            index += [IndexEntry(rollout_file(gid, i), "eval", step, rl_step, ENV.name, arm,
                                 {"seed_index": i}) for i in range(SEEDS)]
    cfg = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT)
    groups = RolloutDriver(policy, chat, cfg, log_dir=log_dir).run(specs).groups
    write_index(log_dir, index)
    record = {"step": step, "phase": "eval", "rl_step": rl_step}
    for arm in ("org", "single"):
        record |= arm_metrics([g for g, a in zip(groups, arm_of) if a == arm], arm)
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
