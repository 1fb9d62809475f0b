"""The task groups of one RLCR step: the sampled ones, and the fresh groups that replace those
without signal (`rollout.refill_groups`).

    groups = StepGroups(cfg, setup.env_by_name, sampler, budget_sampler, rl_step)
    specs = groups.initial()                      # `groups_per_step` groups of K rollouts
    result = driver.run(specs, refill=groups.refill if groups.refills_left else None)

A group whose rollouts' collective rewards all agree (`rl.advantages.has_signal`: the group
filter the update applies) carries no gradient. DAPO's dynamic sampling keeps sampling until
the batch holds enough groups with signal; here each such group, as its last rollout ends, is
replaced by a fresh group (a new task draw and new seeds) while the step's other rollouts still
run, until `rollout.refill_groups` replacements have been played in the step. With 0 (the
report's behaviour) a group without signal is dropped and not replaced.

Everything is deterministic given the step: task draws come from the samplers (their state is
in the checkpoint), and group g's rollout seeds from (seed, rl_step, g) as before, the refills
numbered after the sampled groups.
"""

from __future__ import annotations

from avalon.envs.base import group_seeds
from avalon.org.driver import GroupSpec, RolloutSpec
from avalon.rl.advantages import has_signal
from avalon.rl.types import RolloutGroup
from avalon.train.config import groups_at

SEEDS_PER_STEP = 4096  # seed0 of group g of a step: (seed, rl_step) x this + g x K


class StepGroups:
    """The groups of one RLCR step (see the module docstring)."""

    def __init__(self, cfg, envs: dict, sampler, budget, rl_step: int):
        self.cfg, self.envs, self.sampler, self.budget = cfg, envs, sampler, budget
        self.rl_step = rl_step
        self.k = cfg.rollout.rollouts_per_group
        self.env_of: dict[str, str] = {}
        self.groups = 0  # groups made so far (group ids 0..groups-1)
        self.refilled = 0  # replacements made
        self.without_signal = 0  # groups seen by `refill` that had none

    def initial(self) -> list[GroupSpec]:
        n = groups_at(self.cfg.rollout, self.rl_step)
        return self._make(self.sampler.sample(n))  # same draws on every process

    @property
    def refills_left(self) -> int:
        return max(self.cfg.rollout.refill_groups - self.refilled, 0)

    def refill(self, group: RolloutGroup) -> list[GroupSpec]:
        """The driver's callback: a fresh group in place of `group` if it has no signal and
        replacements are left; else nothing."""
        if has_signal(group, self.cfg.rl):
            return []
        self.without_signal += 1
        if not self.refills_left:
            return []
        self.refilled += 1
        return self._make(self.sampler.sample(1))

    def _make(self, picks) -> list[GroupSpec]:
        cfg, k = self.cfg, self.k
        budgets = self.budget.sample_groups(len(picks), k)
        ratio = cfg.clock.ratio(self.rl_step)  # each environment's own clock, scaled
        specs = []
        for j, (env_name, task_id) in enumerate(picks):
            g = self.groups
            self.groups += 1
            env = self.envs[env_name]
            self.env_of[task_id] = env_name
            seed0 = (cfg.seed * 1_000_003 + self.rl_step) * SEEDS_PER_STEP + g * k
            env_seeds = group_seeds(seed0, k, cfg.rollout.common_random_numbers)
            clock = env.task(task_id).wall_clock_s * ratio
            specs.append(GroupSpec(group_id=g, rollouts=tuple(
                RolloutSpec(env.session(task_id, seed=env_seeds[i], clock_s=clock),
                            budget=budgets[j * k + i], seed=seed0 + i) for i in range(k))))
        return specs
