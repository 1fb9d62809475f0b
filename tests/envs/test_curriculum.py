"""Per-environment clocks: the schedule's ratio scales each environment's own clock."""

import pytest

from avalon.envs.base import Split
from avalon.envs.curriculum import ClockSchedule
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.verification import Verification, VerificationConfig


def test_each_environment_keeps_its_own_clock_scaled_by_the_ratio():
    sched = ClockSchedule(1200.0, 3060.0, 200)
    assert sched.ratio(0) == 1.0 and sched.ratio(100) == pytest.approx(1.775)
    assert sched.ratio(500) == pytest.approx(2.55)
    envs = [ParallelSubtasks(ParallelConfig(clock_s=300.0, n_train=2, n_heldout=1)),
            Verification(VerificationConfig(clock_s=480.0, n_train=2, n_heldout=1))]
    for env, own in zip(envs, (300.0, 480.0)):
        tid = env.task_ids(Split.TRAIN)[0]
        base = env.task(tid).wall_clock_s
        assert base == own
        # What the training loop does: the environment's default clock times the ratio.
        assert env.task(tid, base * sched.ratio(200)).wall_clock_s == pytest.approx(own * 2.55)
