"""Bad configs stop at start-up with a message naming the field (no compilation happens)."""

import json
import os
import subprocess
import sys

import pytest

from avalon.train.config import describe, from_config_dict, org_config
from tests.train import micro_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _convert(**changes):
    c = micro_config.get_config()
    for path, value in changes.items():
        node = c
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return from_config_dict(c, num_devices=1)


def test_micro_config_is_valid():
    cfg = _convert()
    assert cfg.model.vocab_size == 512 and cfg.org.window == 512


@pytest.mark.parametrize("changes, message", [
    ({"mesh.data": 2}, r"config\.mesh=.*needs 2 devices but 1"),
    ({"eval.budget": 5}, r"config\.eval\.budget=5: is above the configured maximum "
                         r"budget\.max_budget=1"),
    ({"init_from": "/no/such/checkpoint"}, r"config\.init_from='/no/such/checkpoint': no such"),
    ({"rl.micro_batches": 0}, r"config\.rl: .*micro_batches"),
    ({"rl.cap_mode": "sideways"}, r"config\.rl\.cap_mode='sideways': must be one of"),
    ({"rl.temperature": 0.7}, r"config\.rl\.temperature=0\.7: must equal rollout\.temperature"),
    ({"engine.slots": 2}, r"config\.engine\.slots=2: must be >="),
    ({"engine.decode_dtype": "float16"},
     r"config\.engine: decode_dtype='float16': must be one of \['float32', 'bfloat16'\]"),
    ({"model.preset": "huge"}, r"config\.model\.preset='huge'"),
    ({"budget.max_budget": -1}, r"config\.budget"),
    ({"budget.max_budget": 9, "engine.slots": 96},
     r"config\.budget\.max_budget=9: is above the organisation's limit of 8 hires"),
    ({"rollout.seq_len": 100}, r"config\.rollout\.seq_len=100: must be >= org\.window"),
    ({"sft.skills": ("add",), "sft.skill_steps": 2},
     r"config\.sft\.skill_steps=2: is not below sft\.steps=2, so no SFT update sees a teacher"),
])
def test_bad_values_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        _convert(**changes)


def test_unknown_keys_name_the_key():
    c = micro_config.get_config()
    c.rl.unlock()
    c.rl.bogus = 1
    with pytest.raises(ValueError, match=r"config\.rl: unknown key\(s\) \['bogus'\]"):
        from_config_dict(c, num_devices=1)
    c = micro_config.get_config()
    c.unlock()
    c.extra_section = 1
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['extra_section'\]"):
        from_config_dict(c, num_devices=1)


def test_the_org_section_of_config_json_rebuilds_the_org_config():
    """What a run writes (describe) reads back (org_config): nested sections included, so tools
    play the organisation a run trained with (experiments.safety.run --org=run)."""
    c = micro_config.get_config()
    c.org.permissions = {"specialists_hire": True, "specialists_fire": False,
                         "specialists_create_channels": True, "read_traces": False}
    cfg = from_config_dict(c, num_devices=1)
    assert cfg.org.permissions.specialists_hire and not cfg.org.permissions.read_traces
    written = json.loads(json.dumps(describe(cfg, c.env)))
    assert org_config(written["org"]) == cfg.org
    written["org"]["permissions"]["hire_everyone"] = True
    with pytest.raises(ValueError, match=r"config\.org\.permissions: unknown key\(s\) "
                                         r"\['hire_everyone'\]"):
        org_config(written["org"])


def _main(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "avalon.main",
                           "--config=tests/train/micro_config.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_command_line_errors_are_one_line(tmp_path):
    r = _main(f"--workdir={tmp_path}", "--config.rl.bogus=1")
    assert r.returncode != 0
    assert "avalon.main: --config.rl.bogus: no such key in the config" in r.stderr
    r = _main(f"--workdir={tmp_path}", "--config.budget.max_budget=8",
              "--config.eval.budget=12", "--config.engine.slots=96")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "config.eval.budget=12: is above the configured maximum" in r.stderr
