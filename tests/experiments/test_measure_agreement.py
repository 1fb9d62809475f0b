"""The training loop, the report and the benchmarks give one number per measure on a small
run: two held-out evaluations of collective verification played by real organisations (the
scripted teacher, a verifier in half the teams, then in every team) through the rollout
driver, logged as the training loop logs them (event files, index, and `metrics.jsonl` from
the loop's own `arm_metrics` on the in-memory rollouts)."""

from __future__ import annotations

import json

from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
from avalon.envs.base import Split
from avalon.envs.verification import Verification, VerificationConfig, VerifyTeacherConfig
from avalon.org.config import OrgConfig, PromptStyle
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.train.evaluation import arm_metrics
from experiments.bench.measure_agreement import markdown, table
from tests.envs.helpers import word_chat

ENV = Verification(VerificationConfig(n_train=8, n_heldout=6))
SEEDS = 2


def _evaluate(workdir, step: int, rl_step: int, verifier_rate: float) -> None:
    """One evaluation as `avalon/train/evaluation.py` plays it: per task, an org arm (budget
    3) and a single arm (budget 0) of SEEDS rollouts each, seeds fixed per task, arm, seed."""
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


def test_loop_report_and_bench_agree_on_a_small_run(tmp_path):
    _evaluate(tmp_path, 600, 0, verifier_rate=0.5)
    _evaluate(tmp_path, 610, 10, verifier_rate=1.0)
    rows = table(str(tmp_path))
    bad = [r for r in rows if not r["agree"]]
    assert not bad, markdown(bad)
    numbers = {(r["arm"], r["measure"]) for r in rows if r["report"] is not None}
    # The organisation has a number for the measures of teams, titles, reviews and their
    # quality; the single agent for none of those (n/a everywhere, in all three).
    for name in ("teams_with_review", "verifier_title_share", "review_precision",
                 "review_recall", "shipped_defects_per_rollout", "coordination_time_share",
                 "messages_per_agent", "reward"):
        assert ("org", name) in numbers, name
    assert ("single", "reward") in numbers and ("single", "teams_with_review") not in numbers
    assert len(numbers) >= 40
    # The two evaluations differ (more verifiers at the second), so the check is not of
    # two copies of one number.
    by = {(r["step"], r["arm"], r["measure"]): r["report"] for r in rows}
    assert by[(600, "org", "verifier_title_share")] < by[(610, "org", "verifier_title_share")]
