"""One source of truth for every environment's scripted teacher: under the clock scheduler the
clocks the scheduler used are `latency.py`'s replay of the written event log, commits come in
clock order, and a second run writes the same bytes."""

import pytest

from avalon.envs.base import Split
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.verification import Verification, VerificationConfig
from avalon.envs.wealth import Wealth, WealthConfig
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.events import read_jsonl
from avalon.org.schedule import verify_schedule
from tests.envs.helpers import BYTES

ENVS = {
    "parallel": lambda: ParallelSubtasks(ParallelConfig(n_train=8, n_heldout=4)),
    "parallel_inspect": lambda: ParallelSubtasks(ParallelConfig(n_train=8, n_heldout=4,
                                                                inspect=True, look_s=5.0)),
    "hidden_profile": lambda: HiddenProfile(ProfileConfig(n_train=8, n_heldout=4)),
    "software": lambda: SoftwareBuild(SoftwareConfig(n_train=8, n_heldout=4)),
    "wealth": lambda: Wealth(WealthConfig(n_train=8, n_heldout=4)),
    "verification": lambda: Verification(VerificationConfig(n_train=8, n_heldout=4)),
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_teacher_clocks_are_the_replay(name, tmp_path):
    env = ENVS[name]()
    ids = env.task_ids(Split.HELDOUT)[:2]
    cfg = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
    logs = []
    for run in range(2):
        groups = [GroupSpec(g, tuple(RolloutSpec(env.session(t, k), budget, seed=k)
                                     for k, budget in enumerate((0, 2, 3))))
                  for g, t in enumerate(ids)]
        out = tmp_path / str(run)
        result = RolloutDriver(env.teacher(BYTES), BYTES, cfg, log_dir=out).run(groups)
        logs.append(sorted((p.name, p.read_bytes()) for p in out.iterdir()))
        for g, scheds in zip(groups, result.scheduled):
            for i, sched in enumerate(scheds):
                events = read_jsonl(out / f"group{g.group_id}_rollout{i}.jsonl")
                assert sum(e["kind"] == "tool_call" for e in events) > 0
                verify_schedule(events, sched, clock_order=True)
    if name != "software":  # run_code's measured wall time is in its log
        assert logs[0] == logs[1]
