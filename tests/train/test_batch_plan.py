"""Batch arithmetic from the mesh (`avalon/train/batch_plan.py`): one function for the rows'
axes, start-up refusals naming the field, and the AOT tool compiling the loop's own shape."""

import importlib.util
import os

import pytest

from avalon.train import batch_plan
from avalon.train.config import from_config_dict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POD = dict(data=1, fsdp=32, expert=4, tensor=1)


def _config(path: str):
    spec = importlib.util.spec_from_file_location("cfg", os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    with config.unlocked():
        config.init_from = ""  # no checkpoint on this host; shapes come from the preset
        config.tokenizer, config.tokenizer_path = "byte", ""
    return config


def test_rows_split_over_data_fsdp_expert_or_data_fsdp_under_sequence_parallelism():
    assert batch_plan.row_axes(POD, sequence_parallel=False) == ("fsdp", "expert")
    assert batch_plan.row_axes(POD, sequence_parallel=True) == ("fsdp",)
    assert batch_plan.seq_axes(POD, sequence_parallel=True) == ("expert",)
    assert batch_plan.seq_axes(POD, sequence_parallel=False) == ()
    p = batch_plan.plan(POD, micro_batches=64, sequence_parallel=True, seq_len=131072,
                        seq_bucket=32, num_processes=32)
    assert (p.row_devices, p.seq_devices, p.multiple, p.local_multiple) == (32, 4, 2048, 64)


def test_pod_config_passes_start_up_on_the_pod_mesh_shape():
    cfg = from_config_dict(_config("configs/nemotron3_super_pod.py"), num_devices=128,
                           num_processes=32)
    assert cfg.mesh == POD
    plan = batch_plan.rl_plan(cfg, 32)
    assert plan.multiple == 2048 and plan.max_rows == 2048
    assert batch_plan.sft_plan(cfg, 32).max_rows == cfg.sft.batch_seqs


def test_old_pod_batch_is_refused_at_start_up_naming_the_field():
    config = _config("configs/nemotron3_super_pod.py")
    with config.unlocked():
        config.sft.micro_batches = 0  # SFT at rl.micro_batches=64: 64 x 32 rows at least
    with pytest.raises(ValueError, match=r"config\.sft\.batch_seqs=256: must be a multiple of "
                                         r"rl\.micro_batches=64 x 32 = 2048"):
        from_config_dict(config, num_devices=128, num_processes=32)
    config = _config("configs/nemotron3_super_pod.py")
    with config.unlocked():
        config.rollout.max_update_rows = 1000
    with pytest.raises(ValueError, match=r"config\.rollout\.max_update_rows=1000"):
        from_config_dict(config, num_devices=128, num_processes=32)
    config = _config("configs/nemotron3_super_pod.py")
    with config.unlocked():
        config.rollout.seq_len = 131074  # not split evenly over the expert axis's 4 chips
        config.org.window = 131072
    with pytest.raises(ValueError, match=r"config\.rollout\.seq_len=131074"):
        from_config_dict(config, num_devices=128, num_processes=32)


def test_rows_that_the_processes_cannot_share_are_refused():
    config = _config("tests/train/micro_config.py")
    with config.unlocked():
        config.mesh.tensor = 2
    with pytest.raises(ValueError, match=r"config\.mesh=.*2 processes cannot share"):
        from_config_dict(config, num_devices=2, num_processes=2)


def test_calls_pad_to_the_multiple_and_split_past_the_cap():
    p = batch_plan.plan({"data": 2}, micro_batches=2, sequence_parallel=False, seq_len=64,
                        seq_bucket=8, num_processes=2)
    assert p.multiple == 8 and p.local_multiple == 4
    assert p.calls(0) == (1, 4) and p.calls(4) == (1, 4) and p.calls(5) == (1, 8)
    capped = batch_plan.plan({"data": 2}, micro_batches=2, sequence_parallel=False, seq_len=64,
                             seq_bucket=8, max_rows=16, num_processes=2)
    assert capped.calls(3) == (1, 4)
    assert capped.calls(8) == (1, 8)
    assert capped.calls(9) == (2, 8) and capped.calls(17) == (3, 8)


@pytest.mark.parametrize("local_rows", [1, 63, 64, 65, 2000, 9000])
def test_aot_compiles_the_batch_the_loop_builds(local_rows):
    """The pod's update step is measured (experiments/scale/aot.py) at the shape of every
    update call the loop makes, whatever the rollouts pack into."""
    from experiments.scale.aot import train_shape
    cfg = from_config_dict(_config("configs/nemotron3_super_pod.py"), num_devices=128,
                           num_processes=32)
    rows, seq, rl_cfg = train_shape(cfg, "cispo", num_processes=32)
    calls, per_call = batch_plan.rl_plan(cfg, 32).calls(local_rows)
    assert (per_call * 32, cfg.rollout.seq_len) == (rows, seq) == (2048, 131072)
    assert calls == -(-local_rows // 64)
    assert rl_cfg.micro_batches == 64
    sft_rows, _, sft_rl = train_shape(cfg, "sft", num_processes=32)
    assert (sft_rows, sft_rl.micro_batches) == (cfg.sft.batch_seqs, cfg.sft.micro_batches)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one", "per_call"])
def test_a_step_past_the_cap_runs_several_calls_of_the_capped_shape(tmp_path, mode):
    """The micro run with update calls capped at 2 rows: every RLCR step that packs more rows
    runs several calls, each on 2 rows, and the run finishes. `one` (the recipe): the calls
    accumulate one gradient and AdamW steps once per RL step; `per_call`: one AdamW step per
    call. (The shaped group filter keeps the random model's groups on their penalties' spread,
    so every step has rows to update on.)"""
    from tests.train.runner import metrics, run_main
    run_main(tmp_path, "--config.rollout.seq_bucket=1", "--config.rollout.max_update_rows=2",
             "--config.rollout.steps=2", f"--config.rl.update_mode={mode}",
             "--config.rl.group_filter=shaped", timeout=1500)
    rl = [r for r in metrics(tmp_path) if r["phase"] == "rl"]
    assert len(rl) == 2
    for r in rl:
        if not r["batch/kept_groups"]:  # nothing to train on: no call at all
            assert (r["train/calls"], r["train/updates"], r["train/skipped"]) == (0, 0, 1)
            continue
        calls = max(1, -(-r["batch/pack_sequences"] // 2))
        assert r["train/calls"] == calls
        assert r["train/updates"] == (1 if mode == "one" else calls)
    assert any(r["train/calls"] > 1 for r in rl)
