"""Sweeps: expansion of a sweep file into `avalon.main` commands (here and on a pod), and the
table and plot over run directories. The slow test runs the budget sweep on the toy's smoke
config end to end."""

import csv
import json
import os
import subprocess
import sys

import pytest

from avalon.train.telemetry import Telemetry
from experiments.sweeps import sweep as sweeps
from experiments.sweeps import table, time_budget
from experiments.sweeps.run import run_sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUDGET = os.path.join(REPO, "experiments", "sweeps", "budget.py")
TIME = os.path.join(REPO, "experiments", "sweeps", "time_budget.py")


def test_budget_sweep_expands_to_nine_runs_with_the_slots_they_need():
    s = sweeps.load(BUDGET)
    assert [r["eval.budget"] for r in s.runs] == list(range(9))
    assert s.config == "configs/toy_org.py" and s.varying[0] == "eval.budget"
    cmd = sweeps.main_command(s, s.runs[8], "/runs/b")
    assert cmd[:4] == ["python", "-m", "avalon.main", "--config=configs/toy_org.py"]
    assert "--workdir=/runs/b/eval.budget=8" in cmd
    assert {"--config.eval.budget=8", "--config.budget.max_budget=8",
            "--config.engine.slots=288"} <= set(cmd)
    zero = sweeps.main_command(s, s.runs[0], "/runs/b")
    assert {"--config.budget.max_budget=1", "--config.budget.p_single=1.0"} <= set(zero)
    t = sweeps.load(TIME + ":smoke")
    assert t.config == "configs/toy_org.py:smoke" and len(t.runs) == 3
    assert sweeps.pod_command(t, t.runs[0], "gs://b/t").startswith(
        "launch/run_pod.sh configs/toy_org.py:smoke gs://b/t/eval.clock_s=120.0 ")


def test_budget_sweep_from_a_trained_run_evaluates_it_at_every_budget():
    s = sweeps.load(BUDGET + ":from=runs/toy")
    assert [r["eval.budget"] for r in s.runs] == list(range(9))
    cmd = sweeps.main_command(s, s.runs[8], "/runs/be")
    assert {"--config.init_from=runs/toy", "--config.sft.steps=0", "--config.rollout.steps=0",
            "--config.eval.budget=8", "--config.budget.max_budget=8"} <= set(cmd)
    assert "--workdir=/runs/be/eval.budget=8" in cmd
    smoke = sweeps.load(BUDGET + ":smoke,from=/r")
    assert smoke.config == "configs/toy_org.py:smoke"
    assert [r["eval.budget"] for r in smoke.runs] == [0, 1, 3]
    for bad in ("from=", "nope", "from=a,from=b"):
        with pytest.raises(ValueError, match="budget sweep argument"):
            sweeps.load(f"{BUDGET}:{bad}")
    t = sweeps.load(TIME + ":from=runs/toy")
    assert [r["eval.clock_s"] for r in t.runs] == list(time_budget.CAPS_S)
    assert t.shared == {"init_from": "runs/toy", "sft.steps": 0, "rollout.steps": 0}
    with pytest.raises(ValueError, match="time-budget sweep argument"):
        sweeps.load(f"{TIME}:from=")


def test_every_expanded_command_is_a_valid_config():
    """Each run's overrides name keys the config has and values it accepts (checked by the
    config's own validation, so a sweep cannot silently drop a field)."""
    import importlib.util

    from ml_collections import config_flags  # noqa: F401  (the same override parser as main)

    from avalon.train.config import from_config_dict
    for path in (BUDGET, TIME, BUDGET + ":smoke", TIME + ":smoke", f"{BUDGET}:from={REPO}",
                 f"{TIME}:from={REPO}"):
        s = sweeps.load(path)
        file, _, arg = s.config.partition(":")
        spec = importlib.util.spec_from_file_location("c", os.path.join(REPO, file))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for run in s.runs:
            c = module.get_config(arg)
            for key, value in {**s.shared, **run}.items():
                node = c
                *parents, last = key.split(".")
                for p in parents:
                    node = node[p]
                assert last in node, (path, key)
                node[last] = value
            from_config_dict(c, num_devices=1)


def test_grid_and_bad_sweeps():
    g = sweeps.grid(**{"rl.lr": [1e-4, 3e-4], "seed": [0, 1]})
    assert g == [{"rl.lr": 1e-4, "seed": 0}, {"rl.lr": 1e-4, "seed": 1},
                 {"rl.lr": 3e-4, "seed": 0}, {"rl.lr": 3e-4, "seed": 1}]
    s = sweeps.Sweep(config="c.py", runs=tuple(g), x="rl.lr")
    assert sweeps.run_name(s, g[1]) == "rl.lr=0.0001,seed=1"  # x repeats: every varying field
    with pytest.raises(ValueError, match="does not set x"):
        sweeps.Sweep(config="c.py", runs=({"seed": 0},), x="rl.lr")
    with pytest.raises(ValueError, match="repeat"):
        sweeps.Sweep(config="c.py", runs=({"seed": 0}, {"seed": 0}), x="seed")
    with pytest.raises(ValueError, match="no such sweep file"):
        sweeps.load("experiments/sweeps/nope.py")


def _fake_run(d, org, single, steps=3, summary=True):
    """A run directory as the real telemetry writes one (not the training)."""
    tel = Telemetry(str(d), enabled=True, stream=open(os.devnull, "w"))
    tel.log(2, {"phase": "eval", "rl_step": 0, "eval/org_reward": 0.0,
                "eval/single_reward": 0.0})
    for s in range(1, steps + 1):
        tel.log(2 + s, {"phase": "rl", "rl_step": s, "reward/mean": org / 2,
                        "org/hires_per_rollout": 1.5})
    tel.log(2 + steps, {"phase": "eval", "rl_step": steps, "eval/org_reward": org,
                        "eval/single_reward": single, "eval/org_reward/std": 0.2,
                        "eval/single_reward/std": 0.1})
    tel.close()
    if summary:
        (d / "summary.json").write_text(json.dumps({"wall_s": 12.5}))


def test_table_and_plot_over_run_directories(tmp_path):
    s = sweeps.load(BUDGET + ":smoke")
    _fake_run(tmp_path / "eval.budget=0", 1.0, 1.0)
    _fake_run(tmp_path / "eval.budget=1", 1.8, 1.1, summary=False)
    (tmp_path / table.STATUS_FILE).write_text(json.dumps({"eval.budget=3": 1}))
    paths = table.write_all(s, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["sweep.csv", "sweep.md", "sweep.png"]
    with open(paths[0]) as f:
        rows = list(csv.DictReader(f))
    assert [r["eval.budget"] for r in rows] == ["0", "1", "3"]
    assert rows[0]["eval/org_reward"] == "1.000" and rows[0]["status"] == "done"
    assert rows[1]["org_minus_single"] == "0.700" and rows[1]["status"] == "unfinished"
    assert rows[1]["org/hires_per_rollout"] == "1.500" and rows[1]["rl_steps"] == "3"
    assert rows[2]["status"] == "failed (rc 1)" and rows[2]["eval/org_reward"] == ""
    md = open(paths[1]).read().splitlines()
    assert md[0].startswith("| run | eval.budget |") and len(md) == 5
    assert open(paths[2], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # Bands: the standard error where the rollout count is logged, else the rollouts' std.
    row = {"eval/org_reward/std": 1.2, "eval/org_rollouts": 48}
    assert table._spread(row, "eval/org_reward", "org") == pytest.approx(1.2 / 48 ** 0.5)
    assert table._spread({"eval/org_reward/std": 1.2}, "eval/org_reward", "org") == 1.2


def test_print_writes_one_pod_command_per_run(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.sweeps.run", f"--sweep={BUDGET}",
                        "--workdir=gs://bucket/b", "--print"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 9 and all(x.startswith("launch/run_pod.sh configs/toy_org.py ")
                                   for x in lines)


@pytest.mark.slow
def test_budget_sweep_on_the_toy_smoke_config(tmp_path):
    """The smoke budget sweep, shrunk further (one RLCR step, one evaluation task), writes the
    table and the plot with every run done."""
    from tests.train.runner import CACHE
    s = sweeps.load(BUDGET + ":smoke")
    shrink = ["--config.sft.teacher_episodes=4", "--config.sft.steps=2",
              "--config.sft.skill_steps=1",
              "--config.rollout.steps=1", "--config.eval.tasks=1", "--config.eval.seeds=1",
              "--config.plots=False", f"--jax_cache_dir={CACHE}"]
    paths = run_sweep(s, str(tmp_path), shrink, stream=open(os.devnull, "w"), cwd=REPO)
    rows = table.collect(s, str(tmp_path))
    assert [r["status"] for r in rows] == ["done"] * 3
    assert all(r["eval/org_reward"] is not None and r["rl_steps"] == 1 for r in rows)
    assert all(os.path.exists(p) for p in paths)

    # The `from=` form: the budget-3 run evaluated at budgets 0, 1 and 3, evaluation only.
    trained = os.path.join(str(tmp_path), "eval.budget=3")
    e = sweeps.load(f"{BUDGET}:smoke,from={trained}")
    out = tmp_path / "from"
    evaluate_only = ["--config.eval.tasks=1", "--config.eval.seeds=1", "--config.plots=False",
                     f"--jax_cache_dir={CACHE}"]  # later flags win: no SFT or RLCR override
    run_sweep(e, str(out), evaluate_only, stream=open(os.devnull, "w"), cwd=REPO)
    rows = table.collect(e, str(out))
    assert [r["status"] for r in rows] == ["done"] * 3
    assert all(r["rl_steps"] == 0 and r["eval/org/hires_per_rollout"] is not None
               for r in rows)
    # At budget 3 the evaluation is the trained run's own last one (same params and seeds).
    want = table.collect(s, str(tmp_path))[2]
    assert rows[2]["eval/org_reward"] == want["eval/org_reward"]
    assert rows[2]["eval/single_reward"] == want["eval/single_reward"]


def test_a_sweep_whose_runs_fail_exits_non_zero(tmp_path):
    """Every run refused at start-up (a budget above the organisation's limit): the sweep
    still writes its table, then says which runs failed and exits 1."""
    sweep_file = tmp_path / "bad.py"
    sweep_file.write_text(
        "from experiments.sweeps.sweep import Sweep\n\n\n"
        "def get_sweep(arg=''):\n"
        "    return Sweep(config='configs/toy_org.py', x='budget.max_budget',\n"
        "                 runs=({'budget.max_budget': 9}, {'budget.max_budget': 10}))\n")
    r = subprocess.run([sys.executable, "-m", "experiments.sweeps.run",
                        f"--sweep={sweep_file}", f"--workdir={tmp_path / 'w'}"], cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert "budget.max_budget=9: is above the organisation's limit of 8 hires" in r.stderr
    assert lines[-1] == ("experiments.sweeps.run: 2 of 2 runs failed (budget.max_budget=9, "
                         "budget.max_budget=10; their output is above); rerun the same command "
                         "to retry them")
    assert (tmp_path / "w" / "sweep.md").exists()  # the table is written all the same
