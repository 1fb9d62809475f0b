"""SIGKILL the main job mid-RL, rerun the same command: it continues with nothing lost.

The killed-and-resumed run must reproduce the uninterrupted run exactly: the same metrics at
every step (rewards, losses, ratios, sampler-driven task and budget choices) and bit-identical
final params and optimizer state. That holds only if the checkpoint carries the step, the
optimizer, both samplers' generators and statistics, and rollout randomness derives from the
seed and step (the curriculum is a function of the step).
"""

import os
import signal
import time

import jax
import numpy as np
import pytest

from avalon.checkpoint.train_state import TrainCheckpointer
from tests.train.runner import deterministic, metrics, run_main, start_main

SFT_STEPS, RL_STEPS = 2, 3


def _steps(workdir):
    d = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def _final_state(workdir):
    with TrainCheckpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        state, host = ckpt.restore()
    return jax.tree.map(np.asarray, state), host


@pytest.mark.slow
@pytest.mark.ci
def test_sigkill_then_rerun_matches_the_uninterrupted_run(tmp_path):
    ref, work = tmp_path / "ref", tmp_path / "killed"
    # The reference run and the run to kill go side by side: a warm-cache run is mostly
    # single-threaded Python (tracing, loading compiled programs), so two fit on two cores.
    ref_log = open(tmp_path / "ref.stderr", "w+")
    ref_proc = start_main(ref, stderr=ref_log)
    proc = start_main(work)
    deadline = time.time() + 600
    # Kill once the first RLCR step's checkpoint exists (SFT's is step 2), before the end.
    while time.time() < deadline and proc.poll() is None:
        if any(s > SFT_STEPS for s in _steps(work)):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    with ref_log:
        ref_proc.wait(timeout=600)
        ref_log.seek(0)
        assert ref_proc.returncode == 0, ref_log.read()[-4000:]
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert max(_steps(work)) < SFT_STEPS + RL_STEPS

    run_main(work)  # the same command again

    got, want = metrics(work), metrics(ref)
    assert [(r["step"], r["phase"]) for r in got] == [(r["step"], r["phase"]) for r in want]
    for g, w in zip(got, want):
        assert deterministic(g) == deterministic(w), (g["step"], g["phase"])
    state, host = _final_state(work)
    ref_state, ref_host = _final_state(ref)
    assert host == ref_host
    assert host["sft_step"] + host["rl_step"] == SFT_STEPS + RL_STEPS
    # The state counts applied updates; a skipped one (no loss tokens) is in the metrics.
    skipped = sum(int(r.get("sft/skipped", r.get("train/skipped", 0))) for r in want)
    assert int(state["step"]) == SFT_STEPS + RL_STEPS - skipped
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
        np.testing.assert_array_equal(a, b)
