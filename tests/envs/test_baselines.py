"""`avalon.tools.env_baselines`: the scripted reference organisations through the real driver,
on a micro config with two co-ordination environments."""

import json
import math
import subprocess
import sys

import pytest

from avalon.envs.base import Split
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.tools.env_baselines import mean_se, run
from tests.train import micro_config


def make_environments(env):
    return [ParallelSubtasks(ParallelConfig(n_subtasks=(4, 6), cost_units=(1, 2), dep_prob=0.8,
                                            max_depth=1, clock_s=240.0, n_train=8,
                                            n_heldout=24, seed=env.seed)),
            HiddenProfile(ProfileConfig(n_train=8, n_heldout=24))]


def config():
    c = micro_config.get_config()
    c.make_environments = make_environments
    c.org.window = 2048
    c.rollout.seq_len = 2048
    c.model.overrides.max_context = 2048
    c.org.max_new_tokens = 128
    c.org.max_turns = 16
    c.budget.max_budget = 3
    c.eval.budget = 3
    c.engine.slots = 64
    return c


def test_mean_se_by_hand():
    assert mean_se([1.0, 2.0, 3.0, 6.0]) == {"mean": 3.0, "se": math.sqrt(14 / 3) / 2}
    assert mean_se([2.0]) == {"mean": 2.0, "se": 0.0}


def test_org_beats_silent_and_single_on_coordination_envs():
    table = run(config(), Split.HELDOUT, 24)
    assert set(table) == {"parallel", "hidden_profile"}
    for env, row in table.items():
        assert set(row) == {"chance", "single", "org_silent", "org", "optimum"}, env
        for other in ("chance", "single", "org_silent"):
            assert row["org"]["mean"] > row[other]["mean"], (env, other)
        assert row["org"]["mean"] <= row["optimum"]["mean"] + 1e-9
    assert table["hidden_profile"]["org"]["mean"] == 1.0  # every brief pooled
    assert table["parallel"]["org"] == table["parallel"]["optimum"]  # the teacher is optimal
    assert table["parallel"]["chance"]["mean"] < 0.3  # answers are checked


@pytest.mark.slow
def test_command_line_prints_one_json_object(tmp_path):
    out = subprocess.run([sys.executable, "-m", "avalon.tools.env_baselines",
                          "--config=configs/toy_org.py", "--tasks=2"], capture_output=True,
                         text=True, check=True, timeout=600)
    table = json.loads(out.stdout)
    assert all({"mean", "se"} <= set(v) for row in table.values() for v in row.values())
