"""`experiments.real_model.behaviour --training`: one row per RLCR step from a hand-written
metrics.jsonl (an evaluation line and SFT lines left out, a step written twice by a resume kept
once, its last line; a missing value shown as "-")."""

from __future__ import annotations

import json

import pytest

from avalon import command
from experiments.real_model.behaviour import training_table


def test_training_table_by_hand(tmp_path):
    lines = [
        {"phase": "sft", "step": 1, "sft_step": 1},
        {"phase": "rl", "step": 2, "rl_step": 1, "rollouts": 8, "reward/mean": 0.0,
         "batch/reward_mean": -0.1, "org/malformed_turns": 2.75, "org/tool_error_turns": 3.125,
         "org/hires_per_rollout": 0.0, "time/step_s": 924.1},
        {"phase": "rl", "step": 3, "rl_step": 2, "rollouts": 8, "reward/mean": 0.5,
         "time/step_s": 10.0},
        {"phase": "rl", "step": 3, "rl_step": 2, "rollouts": 8, "reward/mean": 0.375,
         "batch/reward_mean": 0.2, "org/malformed_turns": 0.375, "org/tool_error_turns": 2.0,
         "org/hires_per_rollout": 0.25, "time/step_s": 637.4},
        {"phase": "eval", "step": 3, "rl_step": 2, "eval/org_reward": 0.1},
        {"phase": "rl", "step": 4, "rl_step": 3, "rollouts": 8, "reward/mean": 0.25},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in lines) + "\n")
    rows = training_table(str(path)).splitlines()
    assert rows[2:] == [
        "| 1 | 8 | 0.000 | -0.100 | 2.75 | 3.12 | 0.00 | 924 |",
        "| 2 | 8 | 0.375 | 0.200 | 0.38 | 2.00 | 0.25 | 637 |",
        "| 3 | 8 | 0.250 | - | - | - | - | - |",
    ]
    assert rows[0].count("|") == rows[2].count("|") == 9


def test_training_table_without_rlcr_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"phase": "sft", "step": 1}) + "\n")
    with pytest.raises(command.Stop, match="no RLCR steps"):
        training_table(str(path))
