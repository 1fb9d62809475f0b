"""`python -m avalon.tools.evaluate` on a finished micro run: the newest checkpoint is evaluated
again with a clock sweep and best-of-k, the organisation and single arms reproduce the run's
own final evaluation logs byte for byte (fixed seeds, same params), and the baselines are
logged beside them."""

import os
import subprocess
import sys

import pytest

from avalon.analysis.logs import read_run, step_dir
from tests.train.runner import CACHE, REPO, environment, run_main


@pytest.mark.slow
def test_evaluate_the_newest_checkpoint_with_baselines(tmp_path):
    run_main(tmp_path)
    last = max(r.step for r in read_run(tmp_path, phase="eval"))
    d = step_dir(tmp_path, "eval", last)
    before = {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)
              if n.startswith("group")}
    r = subprocess.run([sys.executable, "-m", "avalon.tools.evaluate",
                        "--config=tests/train/micro_baselines_config.py",
                        f"--workdir={tmp_path}", f"--jax_cache_dir={CACHE}"], cwd=REPO,
                       env=environment(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    after = {n: open(os.path.join(d, n), "rb").read() for n in before}
    assert after == before
    arms = [x.arm for x in read_run(tmp_path, phase="eval") if x.step == last]
    assert arms.count("best_of_k") == 2 and arms.count("org@120s") == 1
    assert arms.count("single@120s") == 1
    assert '"eval/best_of_k_reward"' in r.stdout


def test_a_directory_without_checkpoints_is_refused(tmp_path):
    from avalon.train.checkpoint_eval import evaluate_latest
    from tests.train import micro_baselines_config
    with pytest.raises(ValueError, match="no checkpoints/ to evaluate"):
        evaluate_latest(micro_baselines_config.get_config(), str(tmp_path / "none"))
    assert not (tmp_path / "none").exists()
