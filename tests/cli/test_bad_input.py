"""Every command-line entry point, fed bad input as a new user would: one line on stderr that
names the thing and what is wrong, the bad-input exit code (2), no traceback, nothing written
(`avalon/command.py`). Table-driven; the commands run as real subprocesses, several at once
(each costs about an import of jax)."""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = "--config=configs/toy_org.py"
# Each case is an import of jax and little else (seconds); on a 2-core machine shared with
# training runs (load 12) four at once took over 300 s.
TIMEOUT_S = 900

# (name, module, arguments, the text the one line must hold); `{tmp}` is a scratch directory
# holding `a_file` (text), `not_json.jsonl`, `metrics.jsonl` (JSON, not events), `empty.jsonl`,
# `empty_dir/` and `out/`.
CASES = [
    ("main: workdir is a file", "avalon.main", [TOY, "--workdir={tmp}/a_file"],
     "--workdir={tmp}/a_file: is a file; give a directory"),
    ("main: workdir not writable", "avalon.main", [TOY, "--workdir=/sys/avalon_run"],
     "--workdir=/sys/avalon_run: cannot write there"),
    ("main: workdir under a file", "avalon.main", [TOY, "--workdir={tmp}/a_file/run"],
     "cannot write there (Not a directory)"),
    ("main: unknown override", "avalon.main",
     [TOY, "--config.rollout.stepz=2", "--workdir={tmp}/out/r"],
     "--config.rollout.stepz: no such key in the config"),
    ("main: no such config", "avalon.main", ["--config=configs/nope.py", "--workdir={tmp}/out/r"],
     "--config=configs/nope.py: no such config file"),
    ("main: workdir left out", "avalon.main", [TOY], "--workdir: required"),
    ("main: unknown flag", "avalon.main", [TOY, "--workdir={tmp}/out/r", "--bogus=1"],
     "--bogus: no such flag"),
    ("main: stray argument", "avalon.main", [TOY, "--workdir={tmp}/out/r", "extra"],
     "unexpected arguments ['extra']"),
    ("main: budget above the organisation's limit", "avalon.main",
     [TOY, "--workdir={tmp}/out/r", "--config.budget.max_budget=9"],
     "config.budget.max_budget=9: is above the organisation's limit of 8 hires"),
    ("analyze: not a run", "avalon.analyze", ["{tmp}/empty_dir"],
     "{tmp}/empty_dir: no events/ directory"),
    ("analyze: no run given", "avalon.analyze", [],
     "the following arguments are required: runs (see --help)"),
    ("analyze: negative episodes", "avalon.analyze", ["{tmp}/empty_dir", "--episodes=-1"],
     "--episodes=-1: must be >= 0"),
    ("analyze: calibrating a generating judge", "avalon.analyze",
     ["{tmp}/empty_dir", "--judge_calibrate"], "--judge_calibrate needs --judge_answer=score"),
    ("view: missing events file", "avalon.tools.view",
     ["{tmp}/nope.jsonl", "--out={tmp}/out/e.html"],
     "{tmp}/nope.jsonl: no such file or directory"),
    ("view: not JSON", "avalon.tools.view", ["{tmp}/not_json.jsonl", "--out={tmp}/out/e.html"],
     "{tmp}/not_json.jsonl: line 2 is not JSON"),
    ("view: JSON but not events", "avalon.tools.view",
     ["{tmp}/metrics.jsonl", "--out={tmp}/out/e.html"],
     "{tmp}/metrics.jsonl: line 1 is not an event"),
    ("view: a directory", "avalon.tools.view", ["{tmp}/empty_dir", "--out={tmp}/out/e.html"],
     "{tmp}/empty_dir: is a directory; give one rollout's .jsonl file"),
    ("view: empty log", "avalon.tools.view", ["{tmp}/empty.jsonl", "--out={tmp}/out/e.html"],
     "{tmp}/empty.jsonl: no events"),
    ("latency: missing events file", "avalon.tools.latency", ["{tmp}/nope.jsonl"],
     "{tmp}/nope.jsonl: no such file or directory"),
    ("latency: not JSON", "avalon.tools.latency", ["{tmp}/not_json.jsonl"],
     "line 2 is not JSON"),
    ("convert: missing source", "avalon.tools.convert",
     ["--src={tmp}/nope", "--dst={tmp}/out/c", "--to=hf"], "--src={tmp}/nope: no such file"),
    ("convert: unknown format", "avalon.tools.convert",
     ["--src={tmp}/empty_dir", "--dst={tmp}/out/c", "--to=onnx"],
     "--to=onnx: value should be one of <avalon|hf>"),
    ("convert: not a checkpoint", "avalon.tools.convert",
     ["--src={tmp}/empty_dir", "--dst={tmp}/out/c", "--to=hf"],
     "is not an avalon checkpoint (no config.json + params/) nor a run directory"),
    ("convert: format left out", "avalon.tools.convert",
     ["--src={tmp}/empty_dir", "--dst={tmp}/out/c"], "--to: required"),
    ("evaluate: no such run", "avalon.tools.evaluate", [TOY, "--workdir={tmp}/nope"],
     "--workdir={tmp}/nope: no such run directory"),
    ("evaluate: run without checkpoints", "avalon.tools.evaluate",
     [TOY, "--workdir={tmp}/empty_dir"], "{tmp}/empty_dir: no checkpoints/ to evaluate"),
    ("env_baselines: no tasks", "avalon.tools.env_baselines", [TOY, "--tasks=0"],
     "--tasks=0: must be >= 1"),
    ("env_baselines: unknown split", "avalon.tools.env_baselines", [TOY, "--split=middle"],
     "--split=middle: value should be one of <train|heldout>"),
    ("model_info: unknown preset", "avalon.tools.model_info", ["--preset=huge"],
     "--preset=huge: value should be one of"),
    ("model_info: no batch", "avalon.tools.model_info", ["--batch=0"],
     "--batch=0: must be at least 1"),
    ("sweep: no such sweep file", "experiments.sweeps.run",
     ["--sweep=experiments/sweeps/nope.py", "--workdir={tmp}/out/s"], "no such sweep file"),
    ("sweep: unknown sweep argument", "experiments.sweeps.run",
     ["--sweep=experiments/sweeps/budget.py:nope", "--workdir={tmp}/out/s"],
     "budget sweep argument"),
    ("sweep: workdir left out", "experiments.sweeps.run",
     ["--sweep=experiments/sweeps/budget.py"], "--workdir: required"),
    ("safety: no runs", "experiments.safety.run",
     ["--checkpoints=x", "--out={tmp}/out/y", "--runs=0"], "--runs must be >= 1"),
    ("safety: unknown scenario", "experiments.safety.run",
     ["--checkpoints=x", "--out={tmp}/out/y", "--scenarios=nope"], "unknown scenario 'nope'"),
    ("safety: not a checkpoint", "experiments.safety.run",
     ["--checkpoints={tmp}/empty_dir", "--out={tmp}/out/y", "--scenarios=stag_hunt"],
     "is neither an avalon params checkpoint"),
    ("safety: out left out", "experiments.safety.run", ["--checkpoints=x"],
     "the following arguments are required: --out"),
]


def _scratch(tmp) -> None:
    (tmp / "a_file").write_text("not a directory\n")
    (tmp / "not_json.jsonl").write_text('{"seq": 0, "agent": "ceo", "kind": "start"}\n{oops\n')
    (tmp / "metrics.jsonl").write_text(json.dumps({"step": 1, "phase": "rl"}) + "\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "empty_dir").mkdir()
    (tmp / "out").mkdir()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case run once, four at a time: {name: (exit code, stderr lines, out/ after)}."""
    tmp = tmp_path_factory.mktemp("bad_input")
    _scratch(tmp)
    env = dict(os.environ, JAX_PLATFORMS="cpu")

    def play(case):
        name, module, args, _ = case
        try:
            r = subprocess.run([sys.executable, "-m", module,
                                *[a.format(tmp=tmp) for a in args]], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a hang fails its own case, not the whole table
            return name, (None, [f"no exit within {TIMEOUT_S} s"], "")
        return name, (r.returncode, [x for x in r.stderr.splitlines() if x.strip()],
                      r.stdout)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        out = dict(pool.map(play, CASES))
    out["tmp"] = tmp
    return out


def test_the_table_covers_every_entry_point():
    modules = {module for _, module, _, _ in CASES}
    tools = {f"avalon.tools.{f[:-3]}" for f in os.listdir(os.path.join(REPO, "avalon", "tools"))
             if f.endswith(".py") and f not in ("__init__.py", "event_log.py")}
    assert tools | {"avalon.main", "avalon.analyze", "experiments.sweeps.run",
                    "experiments.safety.run"} == modules
    assert len(CASES) >= 20


@pytest.mark.parametrize("name, module, args, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(results, name, module, args, message):
    code, lines, stdout = results[name]
    tmp = results["tmp"]
    assert code == 2, (code, lines[-20:])
    assert len(lines) == 1, lines[-20:]
    assert lines[0].startswith(f"{module}: "), lines
    assert message.format(tmp=tmp) in lines[0], lines
    assert stdout == ""
    assert os.listdir(tmp / "out") == []  # nothing was written
