"""verifiers (v1) tasksets in Avalon's loop (`avalon/envs/verifiers_env.py`): the task is the
CEO's brief, the task's own reward functions score the final message, and a few RLCR steps
train on it through `python -m avalon.main` (ci tier)."""

import difflib
import json

import pytest

vf = pytest.importorskip("verifiers.v1")

from avalon.envs.base import Split  # noqa: E402
from avalon.envs.verifiers_env import VerifiersEnvironment  # noqa: E402
from avalon.org.env import EndContext, EndReason  # noqa: E402


def _env():
    from tests.envs.vf_echo import EchoTaskset
    taskset = EchoTaskset(vf.TasksetConfig(id="vf-echo"))
    return VerifiersEnvironment(taskset, n_train=8, n_heldout=2)


def test_tasks_are_briefs_and_splits_do_not_overlap():
    env = _env()
    train, held = env.task_ids(Split.TRAIN), env.task_ids(Split.HELDOUT)
    assert len(train) == 8 and len(held) == 2 and not set(train) & set(held)
    assert env.task(train[0]).prompt == "Be brief.\n\nAnswer with the single word apple."
    with pytest.raises(KeyError, match="no task 'vf-99'"):
        env.task("vf-99")


@pytest.mark.parametrize("answer", ["apple", "an apple pie", ""])
def test_the_tasks_own_reward_scores_the_final_message(answer):
    env = _env()
    session = env.session("vf-0", seed=0)
    out = session.on_end(EndContext(EndReason.FINAL_MESSAGE, answer, 1.0, None))
    want = difflib.SequenceMatcher(None, answer, "apple").ratio()
    assert sum(r.value for r in out.rewards) == pytest.approx(want)
    assert out.metrics["vf/closeness"] == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.ci
def test_rlcr_steps_on_a_verifiers_taskset(tmp_path):
    import subprocess
    import sys

    from tests.train.runner import CACHE, REPO, environment
    work = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "avalon.main",
                        "--config=tests/envs/verifiers_config.py", f"--workdir={work}",
                        f"--jax_cache_dir={CACHE}"], cwd=REPO, env=environment(),
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    rl = [row for row in rows if row.get("phase") == "rl"]
    assert [row["rl_step"] for row in rl] == [1, 2, 3]
    assert all(0.0 <= row["reward/mean"] <= 1.0 for row in rl)  # closeness scores (+ shaping)
