"""Two processes on localhost CPU train together: each runs the organisations of its share of
the task groups, the update step runs on the global 2-device mesh, process 0 writes the record,
whose measures are the report's on the event logs both processes wrote.
"""

import socket

import pytest

from avalon.analysis.report import analyse
from tests.train.pooled_worker import mismatches
from tests.train.runner import metrics, start_main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.ci
def test_two_processes_share_the_groups(tmp_path):
    port = _free_port()
    procs = [start_main(tmp_path, f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                        f"--process_id={i}", "--config.mesh.data=2", "--config.rollout.steps=2",
                        "--config.keep_event_logs=True")
             for i in range(2)]
    errors = [p.communicate(timeout=900)[1] for p in procs]
    for p, err in zip(procs, errors):
        assert p.returncode == 0, err[-4000:]
    records = metrics(tmp_path)
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["rl_step"] for r in rl] == [1, 2]
    for r in rl:
        assert r["processes"] == 2
        assert r["rollouts"] == 4  # 2 groups x K=2, one group run on each process
        assert r["batch/groups"] == 2  # summed over the processes
        # Nothing to learn from (all groups zero-variance) is a skipped update, not an error.
        assert r["train/skipped"] == float(r["train/loss_tokens"] == 0)
    # ... but some step learned: the global update ran on both processes' rows.
    assert any(r["train/skipped"] == 0 and r["train/loss_tokens"] > 0 for r in rl), rl
    assert any(r["phase"] == "eval" for r in records)
    assert [r["step"] for r in records if r["phase"] == "sft"] == [1, 2]
    # Every measure the loop and evaluation logged is the report's over both processes' logs
    # (an RLCR step's rollouts are logged at the step before its update).
    rows = {(c["phase"], c["step"], c["arm"]): c for c in analyse(str(tmp_path))[0]["checkpoints"]}
    for r in rl:
        assert mismatches(r, rows[("rl", r["step"] - 1, "train")]) == [], r["step"]
    for r in (r for r in records if r["phase"] == "eval"):
        for arm in ("org", "single"):
            assert mismatches(r, rows[("eval", r["step"], arm)], arm) == [], (r["step"], arm)
