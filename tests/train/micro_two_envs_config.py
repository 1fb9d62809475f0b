"""The micro run (`micro_config.py`) over two environments and 8 devices, for the multi-process
tests (`test_multihost_shares.py`): the group count ramps 1 -> 2 -> 3 over the RLCR steps, so
two processes see an empty share, even shares and uneven ones, and each plays its own mix of
the two environments; evaluation and the 3 teacher episodes are shared out too."""

from __future__ import annotations

from avalon.envs.hidden_profile.env import HiddenProfile, ProfileConfig
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.parallel.teacher import HirePolicy, ParallelTeacherConfig
from avalon.train.config import mesh_section
from tests.train import micro_config


def make_environments(env):
    return [ParallelSubtasks(ParallelConfig(n_subtasks=(2, 3), dep_prob=0.0, clock_s=240.0,
                                            n_train=16, n_heldout=4, seed=env.seed)),
            HiddenProfile(ProfileConfig(n_holders=(2, 2), clock_s=240.0, n_train=16,
                                        n_heldout=4, seed=env.seed))]


def make_teacher(env, chat):
    if env.name == "parallel":
        return env.teacher(chat, ParallelTeacherConfig(hire_policy=HirePolicy.RANDOM,
                                                       hires_per_turn=1, solves_per_turn=2))
    return env.teacher(chat)


def get_config(arg: str = ""):
    c = micro_config.get_config(arg)
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.mesh = mesh_section(data=8)
    c.sft.teacher_episodes = 3
    c.sft.batch_seqs = 16
    c.rollout.groups_per_step = 1
    c.rollout.groups_per_step_end = 3
    c.rollout.groups_ramp_steps = 2
    c.eval.tasks = 1  # per environment: 2 held-out tasks, one each side
    c.keep_event_logs = True
    return c
