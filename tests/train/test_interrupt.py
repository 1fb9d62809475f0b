"""Ctrl-C and resume as a user meets them (`avalon/main.py`, `avalon/train/config_history.py`):

- Ctrl-C (SIGINT) mid-run ends with one line, `stopped at step N; rerun the same command to
  resume (from its checkpoint at step M)`, exit code 130, and the checkpoint it names exists;
- rerunning with a config that differs in a field a resume is not meant to change is refused
  with one line naming the field and its two values, before anything is built;
- with `--config.allow_config_change` the run goes on with the change, and
  `config_history.jsonl` keeps what changed at which step and the config it replaced, and
  every start's code (its git commit).
Slow: three micro runs.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.train.runner import main_command, metrics, run_main, start_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT_STEPS, RL_STEPS = 2, 3  # tests/train/micro_config.py


def _history(workdir):
    return [json.loads(x) for x in (workdir / "config_history.jsonl").read_text().splitlines()]


def _steps(workdir):
    d = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


@pytest.mark.slow  # three micro runs (~2 min on 2 idle cores); .ci/run runs it
@pytest.mark.ci
@pytest.mark.serial  # beside another busy worker the micro run can end before the signal lands
def test_ctrl_c_says_where_it_stopped_and_a_changed_config_is_refused_or_recorded(tmp_path):
    work = tmp_path / "run"
    log = open(tmp_path / "stderr", "w+")
    proc = start_main(work, stderr=log)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        # In RLCR with a checkpoint written or being written: the second RL step has started
        # (Ctrl-C lets the checkpoint in flight land). On a busy machine an asynchronous
        # checkpoint's directory can appear only near the end of this short run, so the
        # progress line is the signal, not the directory alone.
        started = f"RL 2/{RL_STEPS}" in (tmp_path / "stderr").read_text(errors="replace")
        if started or any(s > SFT_STEPS for s in _steps(work)):
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.05)
    proc.wait(timeout=300)
    log.seek(0)
    err = log.read()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    m = re.fullmatch(r"avalon\.main: stopped at step (\d+); rerun the same command to resume "
                     r"\(from its checkpoint at step (\d+)\)", last)
    assert m, last
    stopped, saved = int(m[1]), int(m[2])
    assert SFT_STEPS < saved <= stopped < SFT_STEPS + RL_STEPS and saved in _steps(work)

    # The same workdir with another learning rate: refused, naming the field and both values.
    r = subprocess.run(main_command(work, "--config.rl.lr=0.5"), cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "1 field differ: rl.lr: 0.001 -> 0.5" in lines[0], lines
    assert "--config.allow_config_change" in lines[0]
    # The record holds the first start only: no change, and the code it ran.
    history = _history(work)
    assert [h["changed"] for h in history] == [{}] and "commit" in history[0]["code"]
    assert json.loads((work / "config.json").read_text())["rl"]["lr"] == 0.001

    # Allowed: the run resumes with the new rate and one more step, and the record keeps both.
    run_main(work, "--config.rl.lr=0.5", "--config.rollout.steps=4",
             "--config.allow_config_change")
    history = _history(work)
    assert len(history) == 2 and history[1]["step"] == saved
    assert history[1]["changed"] == {"rl.lr": {"old": 0.001, "new": 0.5},
                                     "rollout.steps": {"old": RL_STEPS, "new": 4}}
    assert history[1]["previous"]["rl"]["lr"] == 0.001
    assert history[1]["code"] == history[0]["code"]  # each start records its code
    summary = json.loads((work / "summary.json").read_text())
    assert summary["code"] == history[1]["code"]
    assert json.loads((work / "config.json").read_text())["rl"]["lr"] == 0.5
    rl = [r for r in metrics(work) if r["phase"] == "rl"]
    assert [r["rl_step"] for r in rl] == [1, 2, 3, 4]

    # More steps alone is what a resume is for: no flag needed, and it is recorded too.
    run_main(work, "--config.rl.lr=0.5", "--config.rollout.steps=5")
    history = _history(work)
    assert history[-1]["changed"] == {"rollout.steps": {"old": 4, "new": 5}}
