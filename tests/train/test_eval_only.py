"""An evaluation-only run: `init_from` a trained run with 0 SFT + 0 RLCR steps evaluates the
run's params once (the budget sweep's `from=` form), and gives what the trained run's own
evaluation of the same params gave: the same tasks, seeds and policy."""

import pytest

from tests.train.runner import deterministic, metrics, run_main


def _evals(workdir):
    return [r for r in metrics(workdir) if r["phase"] == "eval"]


@pytest.mark.slow
@pytest.mark.ci
def test_evaluation_only_run_reproduces_the_trained_runs_evaluation(tmp_path):
    src, dst = tmp_path / "trained", tmp_path / "evaluated"
    run_main(src, "--config.rollout.steps=0")  # 2 SFT steps, then the evaluation at step 2
    (trained,) = _evals(src)
    assert trained["step"] == 2 and trained["rl_step"] == 0
    args = (f"--config.init_from={src}", "--config.sft.steps=0", "--config.rollout.steps=0")
    r = run_main(dst, *args)
    assert f"evaluation only, of {src}" in r.stderr
    records = metrics(dst)
    assert [rec["phase"] for rec in records] == ["eval"], "no SFT or RLCR record expected"
    got = deterministic(records[0])
    want = deterministic(trained)
    assert got.pop("step") == 0 and want.pop("step") == 2
    assert got == want

    again = run_main(dst, *args)
    assert "is finished" in again.stderr and len(metrics(dst)) == 1

    # A run whose last evaluation is missing (the process died after its last checkpoint,
    # before the evaluation) is not finished: the rerun evaluates, with the same result.
    (dst / "metrics.jsonl").write_text("")
    (dst / "summary.json").unlink()
    third = run_main(dst, *args)
    assert "is finished" not in third.stderr
    assert [deterministic(rec) for rec in metrics(dst)] == [deterministic(records[0])]
