"""The micro run (tests/train/micro_config.py) on a verifiers taskset: RLCR only (no SFT
teacher: the taskset has none), the environment's reward the collective reward."""

from __future__ import annotations

from tests.train import micro_config


def make_environments(env):
    import verifiers.v1 as vf

    from avalon.envs.verifiers_env import VerifiersEnvironment
    from tests.envs.vf_echo import EchoTaskset
    taskset = EchoTaskset(vf.TasksetConfig(id="vf-echo"))
    return [VerifiersEnvironment(taskset, n_train=8, n_heldout=2, clock_s=240.0)]


def make_teacher(env, chat):
    raise ValueError("the verifiers taskset has no teacher (sft.steps is 0)")


def get_config(arg: str = ""):
    c = micro_config.get_config(arg)
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.sft.steps = 0
    c.sft.teacher_episodes = 0
    return c
