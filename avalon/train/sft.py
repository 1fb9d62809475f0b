"""The SFT stage: teacher organisations play training tasks; the model imitates their turns.

Teacher traces are regenerated deterministically from the seed (so a resumed run needs only
the step count, not the traces): episode e plays training task `tasks[e]` with hire budget
`budgets[e]` from the configured budget mix, under the clock of RL step 0. Every agent's rows
are kept (the demonstrated outputs carry the loss), packed once into sequences; each SFT update
takes `batch_seqs` of them, in a fresh permutation per epoch. With several processes each plays
its share of the episodes and every process receives every row (`teacher_traces`); each update
then takes its own slice of the same global batch.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from avalon.envs.base import Split
from avalon.envs.samplers import BudgetSampler
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.rl.batch import TrainBatch
from avalon.rl.build import build_sft_batch
from avalon.rl.types import TrajectoryRow
from avalon.train import batch_plan, distributed
from avalon.train.setup import Setup
from avalon.train.skills import SkillRows, recall_keys

_EPISODES_PER_RUN = 64  # teacher episodes per driver call (bounds workspace and memory use)


@dataclasses.dataclass
class TeacherTraces:
    rows: list[TrajectoryRow]
    mean_reward: float
    episodes: int
    cut_turns: int  # teacher outputs cut at the turn limit (should be 0)


def teacher_traces(setup: Setup) -> TeacherTraces:
    """Every teacher episode's rows and reward. With several processes each plays its share of
    the episodes (`distributed.share_bounds`) and every process receives all rows, in the
    order one process would have produced them (by environment, then episode)."""
    cfg = setup.cfg
    n = cfg.sft.teacher_episodes
    rng = np.random.default_rng([cfg.seed, 1])
    budgets = BudgetSampler(cfg.budget, seed=cfg.seed + 1).sample(n)
    clock = cfg.clock(0)
    plan = []
    for e in range(n):
        env = setup.envs[e % len(setup.envs)]
        ids = env.task_ids(Split.TRAIN)
        plan.append((env, ids[int(rng.integers(len(ids)))], budgets[e]))
    lo, hi = distributed.share_bounds(n, distributed.ProcessInfo(jax.process_index(),
                                                                 jax.process_count()))
    rows, tags, rewards, cut = [], [], [], 0
    teachers = {env.name: cfg.make_teacher(env, setup.chat) for env in setup.envs}
    for env in setup.envs:
        mine = [(t, b, i) for i, (e, t, b) in enumerate(plan) if e is env and lo <= i < hi]
        driver = RolloutDriver(teachers[env.name], setup.chat, cfg.org, share_prefix=False)
        for start in range(0, len(mine), _EPISODES_PER_RUN):
            specs = [GroupSpec(group_id=i, rollouts=(RolloutSpec(
                env.session(t, seed=cfg.seed + i, clock_s=clock), budget=b, seed=cfg.seed + i),))
                for t, b, i in mine[start:start + _EPISODES_PER_RUN]]
            for group in driver.run(specs).groups:
                for rollout in group.rollouts:
                    kept = [r for r in rollout.rows if r.loss_mask.any()]
                    rows += kept
                    tags += [group.group_id] * len(kept)
                    rewards.append((group.group_id, sum(ev.value for ev in rollout.rewards)))
        cut += teachers[env.name].cut_turns
    if jax.process_count() > 1:
        rows, rewards, cut = _gather_traces(rows, tags, rewards, cut, len(setup.envs))
    return TeacherTraces(rows=rows, mean_reward=float(np.mean([r for _, r in rewards]))
                         if rewards else 0.0, episodes=n, cut_turns=cut)


def _gather_traces(rows, tags, rewards, cut, n_envs: int):
    """Every process's teacher rows, rewards and cut turns, ordered as one process plays them
    (environment e % n_envs, then episode e)."""
    payloads = distributed.allgather_bytes(distributed.encode_rows(rows, tags))
    extra = distributed.allgather_json({"rewards": rewards, "cut": cut})
    tagged = [(t, r) for p in payloads for r, t in zip(*distributed.decode_rows(p))]
    order = lambda e: (e % n_envs, e)
    tagged.sort(key=lambda tr: order(tr[0]))  # stable: an episode's rows keep their order
    rewards = sorted(((e, r) for x in extra for e, r in x["rewards"]), key=lambda er: order(er[0]))
    return [r for _, r in tagged], rewards, sum(x["cut"] for x in extra)


class SFTBatches:
    """All teacher rows packed once; `batch(i)` is update i's `batch_seqs` sequences."""

    def __init__(self, setup: Setup, traces: TeacherTraces):
        cfg = setup.cfg
        # batch_seqs fits the mesh: checked at start-up (`batch_plan.check`).
        self.plan = batch_plan.sft_plan(cfg, jax.process_count())
        self.all, stats = build_sft_batch(traces.rows, seq_len=cfg.rollout.seq_len,
                                          min_seqs=cfg.sft.batch_seqs)
        self.fill = stats.packing.fill
        self.n = self.all.tokens.shape[0]
        self.batch_seqs = cfg.sft.batch_seqs
        self.seed = cfg.seed
        self.seq_len = cfg.rollout.seq_len
        self.skill_steps, self.skill_seqs = cfg.sft.skill_steps, cfg.sft.skill_seqs
        self.skills = None
        if cfg.sft.skills:
            words = [w for env in setup.envs for w in env.vocabulary()]
            self.skills = SkillRows(setup.chat.tok, cfg.sft.skills, recall_keys(words),
                                    row_tokens=cfg.sft.skill_row_tokens, seed=cfg.seed)

    def _skill_part(self, i: int, n: int) -> TrainBatch:
        """n sequences of skill rows for update i (each filled on its own, so exactly n)."""
        parts = [build_sft_batch(self.skills.fill((i, j), self.seq_len), seq_len=self.seq_len,
                                 min_seqs=1)[0] for j in range(n)]
        return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)

    def batch(self, i: int) -> TrainBatch:
        """Update i's sequences; with several processes, this process's share of them."""
        if self.skills is None:
            n_skill, j = 0, i
        else:  # the teacher permutation counts only the updates that take teacher rows
            n_skill = self.batch_seqs if i < self.skill_steps else self.skill_seqs
            j = max(0, i - self.skill_steps)
        n_teacher = self.batch_seqs - n_skill
        per_epoch = max(1, self.n // max(n_teacher, 1))
        epoch, k = divmod(j, per_epoch)
        order = np.random.default_rng([self.seed, 2, epoch]).permutation(self.n)
        idx = order[k * n_teacher:(k + 1) * n_teacher]
        parts = [jax.tree.map(lambda x: np.asarray(x)[idx], self.all)] if n_teacher else []
        if n_skill:
            parts.append(self._skill_part(i, n_skill))
        full = parts[0] if len(parts) == 1 else jax.tree.map(
            lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *parts)
        per_process = self.batch_seqs // jax.process_count()
        lo = jax.process_index() * per_process
        return jax.tree.map(lambda x: np.asarray(x)[lo:lo + per_process], full)
