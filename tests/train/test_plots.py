"""End-of-run plots: drawn against the RLCR step, from the lines that have one, and only from
series the code really logs (the old latency panel plotted a key nothing emitted)."""

import json
import types

import numpy as np

from avalon.rl.advantages import score_groups
from avalon.rl.config import RLConfig
from avalon.tokenizer import ByteTokenizer, ChatFormat
from avalon.train import evaluation
from avalon.train.config import from_config_dict
from avalon.train.org_metrics import rollout_metrics
from avalon.train.plots import PLOTTED_KEYS, _series, write_plots
from tests.rl.helpers import make_group, make_rollout, make_row
from tests.train import micro_config

RECORDS = [
    {"step": 1, "phase": "sft", "sft/nll": 3.0},
    {"step": 2, "phase": "eval", "rl_step": 0, "eval/org_reward": 1.0, "eval/single_reward": 0.5,
     "eval/org_reward/std": 0.2, "eval/single_reward/std": 0.1},
    {"step": 3, "phase": "rl", "rl_step": 1, "reward/mean": 0.7, "reward/std": 0.3,
     "org/hires_per_rollout": 1.0, "org/latency_s": 60.0, "clock_s": 300.0},
    {"step": 4, "phase": "rl", "rl_step": 2, "reward/mean": 0.9, "reward/std": 0.1,
     "org/hires_per_rollout": 2.0, "org/latency_s": 150.0, "clock_s": 300.0},
    {"step": 4, "phase": "eval", "rl_step": 2, "eval/org_reward": 1.5, "eval/single_reward": 0.6,
     "eval/org_reward/std": 0.4, "eval/single_reward/std": 0.3},
]


def test_series_use_the_rl_step_and_skip_lines_without_one():
    assert _series(RECORDS, "eval/org_reward") == ([0, 2], [1.0, 1.5], None)
    assert _series(RECORDS, "reward/mean", "reward/std") == ([1, 2], [0.7, 0.9], [0.3, 0.1])
    assert _series(RECORDS, "org/latency_s", per_key="clock_s") == ([1, 2], [0.2, 0.5], None)
    assert _series(RECORDS, "sft/nll") is None  # SFT lines have no RLCR step


def test_write_plots_writes_both_pngs(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in RECORDS)
    paths = write_plots(str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["organisation.png", "reward.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _groups(n_groups=2, k=3):
    rng = np.random.default_rng(0)
    return [make_group(g, [make_rollout([make_row(rng, 8)], [float(i + g)], budget=i % 2,
                                        hires=i % 2) for i in range(k)])
            for g in range(n_groups)]


class _Driver:
    """Stands in for the simulator in `evaluate`: one finished group per spec."""

    def __init__(self, *args, **kw):
        pass

    def run(self, specs):
        rng = np.random.default_rng(len(specs))
        return types.SimpleNamespace(groups=[make_group(
            s.group_id, [make_rollout([make_row(rng, 8)], [1.0], budget=r.budget)
                         for r in s.rollouts]) for s in specs])


def test_every_plotted_key_is_emitted(monkeypatch):
    """The keys an RLCR line gets (the organisation metrics, the advantage statistics under
    `batch/`, the step's clock) and those `evaluate` writes, built by the real code."""
    groups = _groups()
    _, stats = score_groups(groups, RLConfig())
    rl_line = {**rollout_metrics(groups), "clock_s": 300.0,
               **{f"batch/{k}": v for k, v in vars(stats).items()}}
    cfg = from_config_dict(micro_config.get_config(), num_devices=1)
    envs = cfg.make_environments(micro_config.get_config().env)
    monkeypatch.setattr(evaluation, "RolloutDriver", _Driver)
    setup = types.SimpleNamespace(cfg=cfg, envs=envs, chat=ChatFormat(ByteTokenizer()))
    eval_line = evaluation.evaluate(setup, engine=None)
    missing = sorted(PLOTTED_KEYS - set(rl_line) - set(eval_line))
    assert not missing, f"plotted but never logged: {missing}"


def test_panels_have_y_labels_integer_ticks_bands_and_the_organisation_on_top():
    import matplotlib.pyplot as plt

    from avalon.train.plots import REWARD_PANELS, _panel

    fig, ax = plt.subplots()
    assert _panel(ax, RECORDS, REWARD_PANELS[1])  # held-out reward
    assert ax.get_ylabel() == "mean collective reward"
    assert all(float(t).is_integer() for t in ax.get_xticks())
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["organisation"].get_zorder() > lines["single agent"].get_zorder()
    bands = ax.collections  # one std band per arm
    assert len(bands) == 2
    org_band = max(bands, key=lambda b: b.get_zorder())
    ys = org_band.get_paths()[0].vertices[:, 1]
    assert np.isclose(ys.max(), 1.5 + 0.4) and np.isclose(ys.min(), 1.0 - 0.2)
    plt.close(fig)
