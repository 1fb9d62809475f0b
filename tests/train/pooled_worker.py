"""One process of `test_host_metrics_pooled.py`: plays (reads) its share of hand-built event logs,
writes them where the training loop and evaluation write theirs (one index part per process),
and reduces its metrics with the other process's as the loop and evaluation do.

    python -m tests.train.pooled_worker WORKDIR COORDINATOR PROCESS_ID

Process 0 writes the records to WORKDIR/records.json: `rl` (the loop's `org_metrics.rollout_sums`
plus `rollouts`, through `host_metrics.reduce_across_hosts` weighted by rollouts, as
`loop.py` reduces a step's metrics) and `eval` (`evaluation.pooled_arms`, what `evaluate`
returns). The shares are uneven, in rollouts and in every denominator (teams, hires, agents,
working seconds), so a rollout-weighted mean of each process's ratio is not the ratio over the
union (`SPLIT`).
"""

from __future__ import annotations

import json
import math
import os
import sys

from tests.analysis import builders

PROCESSES = 2
DEVICES_PER_PROCESS = 4
# Per process: the hand-built logs (`tests/analysis/builders.py`) it plays, by (phase, arm).
# Training: process 0 has both teams with a review (2 of 2 teams) among 4 rollouts, process 1
# two teams without one (0 of 2) in 2 rollouts: weighted by rollouts 2/3, over the union 1/2.
SPLIT: tuple[dict[tuple[str, str], tuple[str, ...]], ...] = (
    {("rl", "train"): ("team_with_lead", "single_agent", "verification_single",
                       "verification_team"),
     ("eval", "org"): ("team_with_lead", "verification_team", "single_agent"),
     ("eval", "single"): ("single_agent", "verification_single")},
    {("rl", "train"): ("team_without_lead", "parallel_team"),
     ("eval", "org"): ("team_without_lead",),
     ("eval", "single"): ("verification_single",)},
)
PHASE_ARMS = (("rl", "train"), ("eval", "org"), ("eval", "single"))


def logged(process: int, phase: str, arm: str) -> list:
    return [getattr(builders, name)() for name in SPLIT[process][(phase, arm)]]


def groups(process: int, phase: str, arm: str) -> list:
    """The process's rollouts of (phase, arm) as the organisation hands them on, one group."""
    from avalon.rl.types import RewardEvent, Rollout, RolloutGroup
    rollouts = []
    for r in logged(process, phase, arm):
        hires = sum(e["kind"] == "hire" for e in r.events)
        rollouts.append(Rollout(rows=[], rewards=[RewardEvent("ceo", r.reward, 0, "x")],
                                budget=r.budget, hires=hires, worked=hires, events=r.events))
    gid = 1000 * process + PHASE_ARMS.index((phase, arm))
    return [RolloutGroup(gid, f"task{gid}", rollouts)] if rollouts else []


def write_logs(workdir: str, process: int) -> None:
    """Each rollout's event log and this process's index part, in step 0 of its phase."""
    from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
    for phase in ("rl", "eval"):
        log_dir = step_dir(workdir, phase, 0)
        os.makedirs(log_dir, exist_ok=True)
        entries = []
        for p_arm, arm in PHASE_ARMS:
            if p_arm != phase:
                continue
            gid = 1000 * process + PHASE_ARMS.index((phase, arm))
            for i, r in enumerate(logged(process, phase, arm)):
                name = rollout_file(gid, i)
                with open(os.path.join(log_dir, name), "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(e) + "\n" for e in r.events)
                # Seed indices as evaluation writes them, distinct per (env, task) and arm
                # (the report pairs the arms' rollouts by them).
                entries.append(IndexEntry(name, phase, 0, 0, r.env, arm,
                                          {"seed_index": 10 * process + i}))
        write_index(log_dir, entries, part=f"p{process}" if process else "")


def metric_name(measure: str, arm: str | None = None) -> str:
    """The loop's name of a measure, or evaluation's for `arm` (`eval/<arm>/<measure>`)."""
    key = "reward/mean" if measure == "reward" else f"org/{measure}"
    return key if arm is None else f"eval/{arm}/{key.removeprefix('org/')}"


def mismatches(record: dict, row: dict, arm: str | None = None) -> list[str]:
    """The measures on which a metrics record (the loop's, or evaluation's arm `arm`) is not
    the report's checkpoint `row` (`analysis.report.analyse`) on the same rollouts: a value
    not within 1e-12 (the processes add their sums in another order), or a value the report
    says is n/a (or the reverse)."""
    from avalon.analysis import metrics
    out = []
    for m in metrics.MEASURES:
        key, want = metric_name(m.name, arm), row[m.name]
        got = record.get(key)
        if want is None or got is None:
            if (want is None) != (got is None):
                out.append(f"{key}: {got} in the record, {want and want['estimate']} in the "
                           "report")
        elif not math.isclose(got, want["estimate"], rel_tol=1e-12, abs_tol=1e-15):
            out.append(f"{key}: {got} in the record, {want['estimate']} in the report")
    return out


def main(argv: list[str]) -> None:
    workdir, coordinator, process = argv[1], argv[2], int(argv[3])
    import jax
    jax.config.update("jax_num_cpu_devices", DEVICES_PER_PROCESS)
    from avalon.train import distributed, evaluation, host_metrics, org_metrics
    info = distributed.initialize(coordinator, PROCESSES, process)
    assert (info.num_processes, jax.device_count()) == (
        PROCESSES, PROCESSES * DEVICES_PER_PROCESS), (info, jax.devices())
    write_logs(workdir, process)
    train = groups(process, "rl", "train")
    rollouts = sum(len(g.rollouts) for g in train)
    rl = host_metrics.reduce_across_hosts(
        {**org_metrics.rollout_sums(train), "rollouts": rollouts}, weight=rollouts)
    ev = evaluation.pooled_arms({arm: groups(process, "eval", arm) for arm in ("org", "single")})
    if info.is_main:
        with open(os.path.join(workdir, "records.json"), "w", encoding="utf-8") as f:
            json.dump({"rl": rl, "eval": ev}, f)
    distributed.barrier("pooled_worker_done")


if __name__ == "__main__":
    main(sys.argv)
