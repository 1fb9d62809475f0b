"""A corrupt newest checkpoint (one flipped bit): the rerun resumes from the step before it,
says which step it skipped and why (stderr and metrics.jsonl), and redoes the lost step to the
same bits."""

import os
from pathlib import Path

import jax
import numpy as np
import pytest

from avalon.checkpoint.train_state import TrainCheckpointer
from tests.train.runner import metrics, run_main


def _data_file(step_dir: str) -> str:
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state"))
             for f in fs]
    return max(files, key=os.path.getsize)


@pytest.mark.slow
def test_resume_skips_a_corrupt_newest_step_and_redoes_it(tmp_path):
    work = tmp_path / "run"
    run_main(work)
    ckpt_dir = work / "checkpoints"
    with TrainCheckpointer(ckpt_dir) as ckpt:
        newest = ckpt.latest_step()
        assert len(ckpt.all_steps()) >= 2
        want_state, want_host = ckpt.restore(newest)
        want_state = jax.tree.map(np.asarray, want_state)
    path = _data_file(str(ckpt_dir / str(newest)))
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x10
    Path(path).write_bytes(bytes(data))

    r = run_main(work)  # the same command again

    assert f"resume: skipped checkpoint step {newest} (moved to" in r.stderr
    assert "does not match its saved content sum" in r.stderr
    resume = [m for m in metrics(work) if m.get("phase") == "resume"]
    assert len(resume) == 1 and resume[0]["skipped_checkpoints"][0]["step"] == newest
    assert resume[0]["resumed_from"] < newest
    assert os.path.isdir(ckpt_dir / f"{newest}.corrupt")
    with TrainCheckpointer(ckpt_dir) as ckpt:
        assert ckpt.latest_step() == newest
        state, host = ckpt.restore(newest)
    assert host == want_host
    for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, state)), jax.tree.leaves(want_state)):
        np.testing.assert_array_equal(a, b)
