"""Play scenarios: every run of every scenario in ONE driver call, then count from the logs.

    result, counts = play_suite(policy, suite(), runs=30, chat=chat, org=org_config)
    counts[i][j]  # RunCounts of run j of scenarios[i]

One group per scenario (its `runs` rollouts, seeds `seed * 1_000_003 + j`), every rollout a
no-CEO team (`Scenario.team`) with budget 0. Confederates are played by `confederate_policy`
(default: `ConfederateScript`). The engine behind `policy` needs a slot for every peer:
sum(runs x n_agents) over the scenarios.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from avalon.envs.base import Split
from avalon.envs.safety.confederates import ConfederateScript, mix, rollout_confederates
from avalon.envs.safety.counts import RunCounts, count_run
from avalon.envs.safety.judge import Judge, rule_judge
from avalon.envs.safety.scenario import Scenario, ScenarioEnv
from avalon.org.config import OrgConfig
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec, RunResult
from avalon.org.policy import Policy, ScriptedPolicy
from avalon.tokenizer.chat import ChatFormat


def slots_needed(scenarios: Sequence[Scenario], runs: int) -> int:
    return sum(s.n_agents for s in scenarios) * runs


def play_suite(policy: Policy, scenarios: Sequence[Scenario], runs: int, *, chat: ChatFormat,
               org: OrgConfig, seed: int = 0, confederate_policy: Policy | None = None,
               judge: Judge = rule_judge, log_dir: str | os.PathLike | None = None,
               progress=None) -> tuple[RunResult, list[list[RunCounts]]]:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"play_suite: runs must be an int >= 1, got {runs!r}")
    if not org.log_text:
        raise ValueError("play_suite: OrgConfig.log_text must be True (counts read the text)")
    if not scenarios:
        raise ValueError("play_suite: no scenarios")
    groups = []
    for g, s in enumerate(scenarios):
        env = ScenarioEnv(s)
        task_id = env.task_ids(Split.HELDOUT)[0]
        groups.append(GroupSpec(g, tuple(
            RolloutSpec(env.session(task_id, seed=seed * 1_000_003 + j), budget=0,
                        seed=seed * 1_000_003 + j, peers=s.team) for j in range(runs))))
    of_rollout = [s for s in scenarios for _ in range(runs)]
    if confederate_policy is None:
        confederate_policy = ScriptedPolicy(chat, ConfederateScript(of_rollout))
    mixed = mix(policy, confederate_policy, rollout_confederates(scenarios, runs))
    # progress(done, total) as runs end (a progress bar)
    result = RolloutDriver(mixed, chat, org, log_dir=log_dir, progress=progress).run(groups)
    counts = [[count_run(log.events, s, judge) for log in logs]
              for s, logs in zip(scenarios, result.logs)]
    return result, counts
