"""`configs/ors_example.py:smoke` end to end (`python -m avalon.main`) against an environment
written with the `openreward` SDK and served by the SDK on 127.0.0.1. Slow: about 3.5 min on a
loaded 2-core machine (model compilation dominates)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("openreward")

from tests.envs.test_ors_client import ROOT, sdk_server  # noqa: E402, F401 (a fixture)


@pytest.mark.slow
def test_the_smoke_config_trains_on_an_sdk_served_environment(sdk_server, tmp_path):  # noqa: F811
    url, _ = sdk_server
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               OPENREWARD_DISABLE_UPDATE_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "avalon.main",
                           "--config=configs/ors_example.py:smoke", f"--workdir={tmp_path}",
                           f"--config.env.base_url={url}", "--config.env.env_name=counter"],
                          cwd=ROOT, env=env, capture_output=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["sft_steps"] == 0
    assert [e["rl_step"] for e in summary["evals"]] == [0, 2]
