"""End-of-run plots: drawn against the RLCR step, from the lines that have one."""

import json

from avalon.train.plots import _series, write_plots

RECORDS = [
    {"step": 1, "phase": "sft", "sft/nll": 3.0},
    {"step": 2, "phase": "eval", "rl_step": 0, "eval/org_reward": 1.0, "eval/single_reward": 0.5},
    {"step": 3, "phase": "rl", "rl_step": 1, "reward/mean": 0.7, "org/hires_per_rollout": 1.0},
    {"step": 4, "phase": "rl", "rl_step": 2, "reward/mean": 0.9, "org/hires_per_rollout": 2.0},
    {"step": 4, "phase": "eval", "rl_step": 2, "eval/org_reward": 1.5, "eval/single_reward": 0.6},
]


def test_series_use_the_rl_step_and_skip_lines_without_one():
    assert _series(RECORDS, "eval/org_reward") == ([0, 2], [1.0, 1.5])
    assert _series(RECORDS, "reward/mean") == ([1, 2], [0.7, 0.9])
    assert _series(RECORDS, "sft/nll") is None  # SFT lines have no RLCR step


def test_write_plots_writes_both_pngs(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in RECORDS)
    paths = write_plots(str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["organisation.png", "reward.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
