"""Progress bars of the commands that play many rollouts (`avalon.tools.evaluate`, the safety
suite): the driver reports each rollout as it ends, and the line draws done / total with the
time so far and an ETA from it."""

import io

import pytest

from avalon.command import ProgressLine
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy
from tests.org.helpers import CHAT, call, step
from tests.org.toyenv import PartsEnv


@pytest.mark.parametrize("continuous", [False, True])
def test_the_driver_reports_every_rollout_as_it_ends(continuous):
    # Rollouts of different lengths: one stops at once, the others work first.
    steps = {"ceo": [step(call("work", part="a"), call("work", part="b")),
                     step(call("final_message", text="done"))]}
    seen = []
    driver = RolloutDriver(ScriptedPolicy(CHAT, Playbook(steps)), CHAT, OrgConfig.scaled(8192),
                           continuous=continuous,
                           progress=lambda done, total: seen.append((done, total)))
    groups = [GroupSpec(g, tuple(RolloutSpec(PartsEnv(), 0, g * 10 + i) for i in range(3)))
              for g in range(2)]
    driver.run(groups)
    assert seen and seen[-1] == (6, 6)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and {t for _, t in seen} == {6}
    seen.clear()
    driver.run(groups[:1])  # a second run counts its own rollouts
    assert seen[-1] == (3, 3)


def test_the_line_draws_done_total_elapsed_and_eta():
    now = [100.0]
    out = io.StringIO()
    bar = ProgressLine("evaluating", "rollouts", stream=out, width=10, clock=lambda: now[0])
    now[0] += 30.0
    bar(1, 4)
    assert out.getvalue() == "\revaluating [##        ] 1/4 rollouts 0m30s ETA 1m30s"
    now[0] += 90.0
    bar(4, 4)
    assert out.getvalue().endswith("\revaluating [##########] 4/4 rollouts 2m00s ETA 0m00s\n")
