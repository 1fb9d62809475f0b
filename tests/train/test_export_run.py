"""Export and import of trained runs: a run directory (or one of its checkpoints) converts to a
Hugging Face checkpoint that transformers loads with the same logits as Avalon's forward, and
`init_from` takes run directories, avalon params checkpoints and HF directories alike.

The run here is a saved training state of the micro config written the way `avalon.main`
writes one (`config.json` from `describe`, `TrainCheckpointer` states under `checkpoints/`),
with every weight perturbed so none is left at its initial value; `test_trained_run.py` (slow)
does the same after real training.
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from avalon import model as M  # noqa: E402
from avalon import sharding  # noqa: E402
from avalon.checkpoint import avalon_format  # noqa: E402
from avalon.checkpoint.train_state import TrainCheckpointer  # noqa: E402
from avalon.rl.update import make_update_step  # noqa: E402
from avalon.tools import convert  # noqa: E402
from avalon.train import run_dir  # noqa: E402
from avalon.train.config import describe, from_config_dict  # noqa: E402
from avalon.train.setup import initial_params  # noqa: E402
from tests.train import micro_config  # noqa: E402

TOL = 1e-4  # as tests/checkpoint/test_hf_parity.py


def _config(**changes):
    c = micro_config.get_config()
    c.mesh.data = jax.device_count()
    c.sft.batch_seqs = jax.device_count()  # SFT rows split over the data axis
    for k, v in changes.items():
        c[k] = v
    return c, from_config_dict(c, num_devices=jax.device_count())


def save_run(workdir, steps=(3, 7), seed=0):
    """A run directory with training states at `steps`; returns {step: params as numpy}."""
    c, cfg = _config()
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(describe(cfg, c.env), f)
    mesh = sharding.make_mesh(cfg.mesh)
    update = make_update_step(cfg.model, cfg.rl, mesh=mesh)
    _, params = initial_params(cfg, mesh)
    rng = np.random.default_rng(seed)
    saved = {}
    with TrainCheckpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        for step in steps:
            params = jax.tree.map(lambda x: jax.device_put(
                x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype), x.sharding), params)
            ckpt.save(step, update.init_state(params), {"sft_step": step, "rl_step": 0})
            saved[step] = jax.tree.map(np.asarray, params)
    return cfg, saved


def _same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_init_from_a_run_directory_resumes_its_params(tmp_path):
    run = tmp_path / "run"
    cfg, saved = save_run(run)
    mesh = sharding.make_mesh(cfg.mesh)
    _, got = initial_params(_config(init_from=str(run))[1], mesh)
    _same(got, saved[7])  # the newest checkpoint
    _, got = initial_params(_config(init_from=str(run / "checkpoints" / "3"))[1], mesh)
    _same(got, saved[3])  # a chosen step
    # Exported as avalon params, the same params come back through init_from too.
    convert.convert(run, tmp_path / "avalon", convert.Target.AVALON, progress=False)
    assert avalon_format.is_avalon_checkpoint(tmp_path / "avalon")
    _, got = initial_params(_config(init_from=str(tmp_path / "avalon"))[1], mesh)
    _same(got, saved[7])


def test_a_directory_that_is_no_run_is_refused(tmp_path):
    assert not run_dir.is_run(tmp_path)
    with pytest.raises(ValueError, match="not a run directory"):
        run_dir.load_run_params(tmp_path, sharding.make_mesh({"data": jax.device_count()}))
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        run_dir.load_run_params(tmp_path, sharding.make_mesh({"data": jax.device_count()}))


@pytest.mark.hf
def test_export_a_run_to_hf_and_load_it_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    cfg, saved = save_run(run)
    for src, step in ((run, 7), (run / "checkpoints" / "3", 3)):
        out = tmp_path / f"hf{step}"
        convert.convert(src, out, convert.Target.HF, progress=False)
        model, info = transformers.NemotronHForCausalLM.from_pretrained(
            out, dtype=torch.float32, output_loading_info=True)
        model.eval()
        assert not info["missing_keys"] and not info["unexpected_keys"]
        assert not info["mismatched_keys"]
        ids = np.random.default_rng(step).integers(0, cfg.model.vocab_size, (2, 19))
        with torch.no_grad():
            want = model(torch.tensor(ids)).logits.numpy()
        params = jax.tree.map(jnp.asarray, saved[step])
        got = np.asarray(jax.jit(M.forward, static_argnames=("cfg",))(
            params, jnp.asarray(ids, jnp.int32), cfg=cfg.model).logits, np.float64)
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        assert err <= TOL, (step, err)
    # And the exported HF directory is an init_from source with the same params.
    mesh = sharding.make_mesh(cfg.mesh)
    _, got = initial_params(_config(init_from=str(tmp_path / "hf7"))[1], mesh)
    _same(got, saved[7])


def test_an_export_carries_the_card_of_the_run_not_of_its_base(tmp_path):
    """A run started from an HF directory with a README of its own (the shipped seed's, say):
    its export keeps the base's tokenizer files but writes the card of the run: the step
    exported, the updates behind it, the evaluations up to it, the code and the command."""
    run = tmp_path / "run"
    save_run(run)
    base = tmp_path / "base"
    convert.convert(run / "checkpoints" / "3", base, convert.Target.HF, progress=False)
    (base / "README.md").write_text("# The seed\n\nHow the seed was made.\n")
    (base / "tokenizer_config.json").write_text("{}")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "init_from": str(base)}))
    (run / "config_history.jsonl").write_text(json.dumps(
        {"step": 0, "command": ["python", "-m", "avalon.main", "--workdir=run"],
         "code": {"commit": "c0ffee" * 7, "dirty": False}}) + "\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 3, "phase": "eval", "rl_step": 0, "eval/org_reward": 0.25,
         "eval/single_reward": 0.5},
        {"step": 9, "phase": "eval", "rl_step": 6, "eval/org_reward": 1.0,
         "eval/single_reward": 0.5}]))
    out = tmp_path / "hf"
    convert.convert(run, out, convert.Target.HF, param_dtype="bfloat16", progress=False)
    card = (out / "README.md").read_text()
    assert "The seed" not in card and (out / "tokenizer_config.json").read_text() == "{}"
    sft = micro_config.get_config().sft.steps
    assert "# `run`, step 7: an Avalon training run" in card
    assert f"at checkpoint step 7: {min(7, sft)} SFT updates, then {7 - min(7, sft)} RLCR" in card
    assert f"Started from: `{base}` (that checkpoint's own card describes it" in card
    assert "commit c0ffeec0ffee" in card and "`python -m avalon.main --workdir=run`" in card
    assert "parameters stored as bfloat16" in card
    assert "| 3 | 0 | 0.25 | 0.50 |" in card and "| 9 |" not in card  # after step 7: not this
