"""Ratio measures pooled across processes: a multi-process run logs each measure of
`avalon/analysis/metrics.py` over the union of its processes' rollouts, the number the report
(`avalon.analysis.report.analyse`) gives on the run's event logs, not a rollout-weighted mean
of each process's ratio. The shares (`pooled_worker.SPLIT`) are uneven in rollouts and in every
denominator, so the two differ (checked here, so the tests cannot pass by coincidence)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from avalon.analysis import metrics
from avalon.analysis.judges import RuleJudge
from avalon.analysis.report import analyse
from avalon.train import host_metrics, org_metrics
from avalon.train.host_metrics import Pooled, Shares
from tests.train import pooled_worker
from tests.train.runner import REPO, environment


def _key(name: str) -> str:
    return pooled_worker.metric_name(name)


def _report(logs) -> dict:
    """The report's `aggregate` over `logs` (its rule judge, as `analyse` labels)."""
    labels = metrics.judge_rollouts([r.events for r in logs], RuleJudge())
    return metrics.aggregate([metrics.rollout_metrics(r.events, lab)
                              for r, lab in zip(logs, labels)])


def _weighted_mean_of_ratios(phase: str, arm: str) -> dict:
    """What the processes logged before: each process's values, mean weighted by rollouts."""
    parts = [(org_metrics.rollout_metrics(pooled_worker.groups(p, phase, arm)),
              len(pooled_worker.SPLIT[p][(phase, arm)])) for p in range(pooled_worker.PROCESSES)]
    return host_metrics.combine(parts)


def test_measures_over_processes_are_the_measures_over_the_union():
    """Each process's sums through the bytes `reduce_across_hosts` gathers (`payload`), against
    the report's aggregate over every process's rollouts at once."""
    phase, arm = "rl", "train"
    parts = [host_metrics.payload(org_metrics.rollout_sums(pooled_worker.groups(p, phase, arm)),
                                  len(pooled_worker.SPLIT[p][(phase, arm)]))
             for p in range(pooled_worker.PROCESSES)]
    record = host_metrics.from_payloads(parts)
    union = [r for p in range(pooled_worker.PROCESSES)
             for r in pooled_worker.logged(p, phase, arm)]
    report = _report(union)
    assert pooled_worker.mismatches(record, report) == []
    # End reasons: 1 of 4 and 1 of 2 ended on a final message, so 2 of 6 (not 1/4 and 1/2
    # weighted: 1/3 too here); env_terminal 2 of 4 on process 0 only: 2 of 6, not 2 of 4.
    assert record["org/end_final_message"] == pytest.approx(2 / 6)
    assert record["org/end_env_terminal"] == pytest.approx(2 / 6)
    assert record["org/end_deadlock"] == pytest.approx(2 / 6)
    assert record["reward/std"] == pytest.approx(np.std([r.reward for r in union]), rel=1e-12)
    # The old reduction's numbers differ from the report's on these shares.
    old = _weighted_mean_of_ratios(phase, arm)
    for name in ("teams_with_review_message", "coordination_time_share", "messages_per_agent",
                 "lead_title_share", "review_message_tokens_per_org_hour"):
        assert old[_key(name)] != pytest.approx(report[name]["estimate"], rel=1e-6), name
    assert record["org/teams_with_review_message"] == 0.5
    assert old["org/teams_with_review_message"] == 2 / 3


def test_a_share_one_process_never_saw_counts_zero_of_its_rollouts():
    a = {"org/end_": Shares({"wall_clock": 1, "final_message": 2}, 3)}
    b = {"org/end_": Shares({"final_message": 1}, 1)}
    out = host_metrics.finish(host_metrics.combine([(a, 3.0), (b, 1.0)]))
    assert out == {"org/end_final_message": 0.75, "org/end_wall_clock": 0.25}


def test_a_measure_is_na_only_where_no_process_has_a_denominator():
    one = {"org/teams_with_review": Pooled(0.0, 0.0), "org/budget_use": Pooled(0.0, 0.0)}
    two = {"org/teams_with_review": Pooled(0.0, 2.0), "org/budget_use": Pooled(0.0, 0.0)}
    out = host_metrics.from_payloads([host_metrics.payload(one, 5.0),
                                      host_metrics.payload(two, 1.0)])
    assert out == {"org/teams_with_review": 0.0}
    # A process alone: the same values as one process's `rollout_metrics`.
    assert host_metrics.finish(one) == {}


def test_a_std_beside_a_pooled_mean_is_the_std_of_the_union():
    xs, ys = [1.0, 2.0, 4.0], [3.0, 5.0]
    out = host_metrics.finish(host_metrics.combine([
        ({"r/mean": Pooled(sum(xs), len(xs)), "r/std": float(np.std(xs))}, 99.0),
        ({"r/mean": Pooled(sum(ys), len(ys)), "r/std": float(np.std(ys))}, 1.0)]))
    assert out["r/mean"] == pytest.approx(np.mean(xs + ys), rel=1e-12)
    assert out["r/std"] == pytest.approx(np.std(xs + ys), rel=1e-12)  # weights: 3 and 2


def test_a_ratio_that_is_a_value_on_another_process_is_refused():
    with pytest.raises(ValueError, match="org/x"):
        host_metrics.combine([({"org/x": Pooled(1.0, 2.0)}, 1.0), ({"org/x": 0.5}, 1.0)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_of_four_devices_log_the_reports_numbers(tmp_path):
    """Two processes (jax.distributed over gloo, 4 CPU devices each) write their shares'
    event logs and reduce their metrics as the loop and evaluation do; the report over the
    run directory (both index parts) gives the same number for every measure."""
    port = _free_port()
    env = dict(environment(), PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.train.pooled_worker",
                               str(tmp_path), f"127.0.0.1:{port}", str(p)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for p in range(pooled_worker.PROCESSES)]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    for i, (p, err) in enumerate(zip(procs, errors)):
        assert p.returncode == 0, f"process {i}:\n{err[-3000:]}"
    with open(os.path.join(tmp_path, "records.json"), encoding="utf-8") as f:
        records = json.load(f)
    report, _ = analyse(str(tmp_path))
    rows = {(c["phase"], c["arm"]): c for c in report["checkpoints"]}
    assert set(rows) == set(pooled_worker.PHASE_ARMS)
    assert rows[("rl", "train")]["rollouts"] == records["rl"]["rollouts"] == 6
    assert pooled_worker.mismatches(records["rl"], rows[("rl", "train")]) == []
    for arm in ("org", "single"):
        row = rows[("eval", arm)]
        assert records["eval"][f"eval/{arm}_rollouts"] == row["rollouts"]
        assert records["eval"][f"eval/{arm}_reward"] == pytest.approx(
            row["reward"]["estimate"], rel=1e-12)
        assert pooled_worker.mismatches(records["eval"], row, arm) == []
    # The evaluation's uneven shares: 2 of 2 teams reviewed in 3 rollouts beside 0 of 1 in 1.
    assert records["eval"]["eval/org/teams_with_review_message"] == pytest.approx(2 / 3)
    assert _weighted_mean_of_ratios("eval", "org")["org/teams_with_review_message"] == 0.75
