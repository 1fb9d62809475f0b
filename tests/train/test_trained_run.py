"""One real micro run of `python -m avalon.main` (SFT, RLCR, evaluation, plots, event logs),
then what a user does with it: reads its files, reruns the finished command, exports it to
Hugging Face and loads it in transformers. Slow: the run takes about a minute on 2 cores."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from avalon import model as M  # noqa: E402
from avalon.checkpoint.train_state import TrainCheckpointer  # noqa: E402
from avalon.tools import convert  # noqa: E402
from avalon.train.plots import PLOTTED_KEYS  # noqa: E402
from tests.train.runner import metrics, run_main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trained") / "run"
    r = run_main(workdir, "--config.plots=True", "--config.keep_event_logs=True")
    return workdir, r


def test_the_run_says_where_it_starts_and_what_it_wrote(run):
    workdir, r = run
    assert f"avalon: tests/train/micro_config.py -> {workdir} | 1 cpu device(s)" in r.stderr
    assert "mesh data=1 fsdp=1 expert=1 tensor=1" in r.stderr
    assert "evaluating at RL step 0" in r.stderr and "compiling" in r.stderr
    end = [line for line in r.stderr.splitlines() if line.startswith("avalon: done in")]
    assert len(end) == 1 and "Held-out reward at RL step 3: organisation" in end[0]
    for name in ("metrics.jsonl", "reward.png", "organisation.png", "events", "summary.json"):
        assert name in end[0] and os.path.exists(workdir / name), name
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["config"] == "tests/train/micro_config.py"
    assert summary["command"][:3] == ["python", "-m", "avalon.main"]
    assert 1 < summary["wall_s"] < 3600 and summary["steps"] == 5
    config = json.loads((workdir / "config.json").read_text())
    assert config["env"] == {"seed": 0} and config["rollout"]["steps"] == 3


def test_the_run_records_its_tokenizer_with_the_ids_it_trained_with(run):
    from avalon.tokenizer.record import RECORD_FILE, from_record
    from avalon.train.config import from_config_dict
    from avalon.train.setup import build_tokenizer
    from tests.train import micro_config
    workdir, _ = run
    record = json.loads((workdir / RECORD_FILE).read_text())
    c = micro_config.get_config()
    cfg = from_config_dict(c, num_devices=1)
    trained = build_tokenizer(cfg, list(cfg.make_environments(c.env)))
    assert record["kind"] == "word" and record["words"] == trained.words
    text = "hire a1: solve t3 = 42, then report_to_ceo"
    assert from_record(record).encode(text) == trained.encode(text)


def test_every_plotted_series_is_logged_and_no_mfu_on_cpu(run):
    workdir, _ = run
    logged = {k for r in metrics(workdir) for k in r}
    assert not sorted(PLOTTED_KEYS - logged)
    assert not [k for k in logged if "mfu" in k]  # a CPU has no peak to measure against


def test_a_finished_workdir_says_so(run):
    workdir, _ = run
    before = (workdir / "metrics.jsonl").read_text()
    r = run_main(workdir)
    assert f"avalon: {workdir} is finished (2 SFT + 3 RLCR steps); nothing to do." in r.stderr
    assert (workdir / "metrics.jsonl").read_text() == before


def test_the_trained_run_exports_to_transformers_with_the_same_logits(run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    workdir, _ = run
    convert.convert(workdir, tmp_path / "hf", convert.Target.HF, progress=False)
    model = transformers.NemotronHForCausalLM.from_pretrained(tmp_path / "hf",
                                                              dtype=torch.float32)
    model.eval()
    with TrainCheckpointer(workdir / "checkpoints") as ckpt:  # the trained params, read plainly
        state, host = ckpt.restore()
    assert host["rl_step"] == 3
    config = json.loads((workdir / "config.json").read_text())
    from avalon.checkpoint.avalon_format import config_from_dict
    cfg = config_from_dict(config["model"])
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 23))
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), state["params"])
    got = np.asarray(M.forward(params, jnp.asarray(ids, jnp.int32), cfg=cfg).logits, np.float64)
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) <= 1e-4
