"""Hosts that stay in step: two processes x 4 CPU devices (jax.distributed, gloo) against one
process x 8 devices, same config (`micro_two_envs_config.py`): RLCR steps of 1, 2 and 3 task
groups (an empty share, even shares, uneven ones), each process playing its own mix of two
environments (different metric names on each side, reduced by name), 3 teacher episodes split
2 + 1 and evaluation tasks split across the processes. Both runs finish, and rewards and losses
agree within float reduction-order error (the same rollouts, reduced in another order)."""

import json
import os
import socket

import pytest

from tests.train.runner import REPO, environment, main_command, metrics

CONFIG = "--config=tests/train/micro_two_envs_config.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = environment()
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + f" --xla_force_host_platform_device_count={devices}").strip()
    return env


def _start(workdir, *extra, devices):
    import subprocess
    cmd = [a if not a.startswith("--config=") else CONFIG for a in main_command(workdir)]
    return subprocess.Popen(cmd + list(extra), cwd=REPO, env=_env(devices),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(procs):
    errors = [p.communicate(timeout=3000)[1] for p in procs]
    failed = [(i, err) for i, (p, err) in enumerate(zip(procs, errors)) if p.returncode != 0]
    # Every failed process's first traceback: the one that failed first is not the last to say
    # so (the others then fail at a collective or at the shutdown barrier).
    assert not failed, "\n".join(
        f"process {i}: " + (err[err.index("Traceback"):][:3000] if "Traceback" in err
                            else err[-3000:]) for i, err in failed)


# Rewards are sums of environment numbers; losses are token-normalised sums over the same
# tokens packed into other rows on each side.
_REWARDS = ("reward/mean", "batch/reward_mean", "eval/org_reward", "eval/single_reward",
            "sft/teacher_reward")
_LOSSES = ("train/loss", "sft/loss")
_COUNTS = ("rollouts", "batch/groups", "batch/kept_groups", "train/loss_tokens",
           "sft/loss_tokens", "eval/org_rollouts", "eval/single_rollouts")


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_of_eight(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _finish([_start(one, devices=8)])
    port = _free_port()
    _finish([_start(two, f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                    f"--process_id={i}", devices=4) for i in range(2)])
    a, b = metrics(one), metrics(two)
    assert [(r["phase"], r["step"]) for r in a] == [(r["phase"], r["step"]) for r in b]
    rl = [r for r in b if r["phase"] == "rl"]
    assert [r["batch/groups"] for r in rl] == [1, 2, 3]  # an empty share, then even, uneven
    assert all(r["processes"] == 2 for r in rl)
    assert any(r["train/loss_tokens"] > 0 for r in rl)  # some update learned (not all skipped)
    for ra, rb in zip(a, b):
        for key in _COUNTS:
            assert ra.get(key) == rb.get(key), (ra["phase"], ra["step"], key)
        for key in _REWARDS + _LOSSES:
            if key in ra or key in rb:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-6), \
                    (ra["phase"], ra["step"], key)
    # Each process played its own mix of the environments in some step (so each reported
    # metric names the other did not), and both wrote their evaluation rollouts' logs.
    mixes = []
    for r in rl:
        step = os.path.join(two, "events", "rl", f"step{r['step'] - 1}")  # logged before
        parts = [os.path.join(step, f) for f in sorted(os.listdir(step)) if f.startswith("index")]
        mixes.append([{json.loads(line)["env"] for line in open(p)} for p in parts])
    assert any(len(m) == 2 and m[0] and m[1] and m[0] != m[1] for m in mixes), mixes
    evals = sorted(os.listdir(os.path.join(two, "events", "eval")))
    for step in evals:
        assert sorted(f for f in os.listdir(os.path.join(two, "events", "eval", step))
                      if f.startswith("index")) == ["index-p1.jsonl", "index.jsonl"]
