"""`python -m avalon.main` as a new user meets it: every bad flag value is one line naming the
field and the value, and it stops before anything compiles (each case takes about the time of
importing jax)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "avalon.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--config=configs/toy_org.py", "--config.rollout.steps=abc"],
     "avalon.main: --config.rollout.steps=abc: invalid literal for int()"),
    (["--config=configs/toy_org.py", "--config.plots=maybe"],
     "avalon.main: --config.plots=maybe: ('Non-boolean argument to boolean flag', 'maybe')"),
    (["--config=configs/no_such_config.py"],
     "avalon.main: --config=configs/no_such_config.py: no such config file"),
    (["--config=configs/toy_org.py:smok"],
     "avalon.main: --config=configs/toy_org.py:smok: config argument 'smok' is not accepted; "
     "this config takes ['smoke', 'smoke_seed', 'tiers'] (or none)"),
    (["--config=configs/nemotron3_super_pod.py:smoke"],
     "avalon.main: --config=configs/nemotron3_super_pod.py:smoke: config argument 'smoke' is "
     "not accepted"),
    (["--config=configs/toy_org.py", "--config.rollout.stepz=2"],
     "avalon.main: --config.rollout.stepz: no such key in the config"),
    (["--config=configs/toy_org.py", "--config.rl.lr=fast"],
     "avalon.main: --config.rl.lr=fast: could not convert string to float: 'fast'"),
    # `tensor` is a mesh axis: the key is accepted, and the mesh check names the real problem.
    (["--config=configs/toy_org.py", "--config.mesh.tensor=2"],
     "avalon.main: config.mesh={'data': 1, 'expert': 1, 'fsdp': 1, 'tensor': 2}: needs 2 "
     "devices but 1 are available"),
])
def test_bad_flag_values_are_one_line(tmp_path, args, message):
    r = _main(*args, f"--workdir={tmp_path}")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert message in lines[0], lines[0]
    assert not os.listdir(tmp_path)  # nothing was written: it stopped at start-up


def test_every_config_accepts_its_own_arguments():
    """The `:arg` check refuses only what no config takes (the documented switches work)."""
    import importlib.util

    for name, args in (("toy_org", ("", "smoke")), ("gpu_hybrid_2b", ("", "smoke")),
                       ("nemotron3_super_pod", ("",))):
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs",
                                                                         f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for arg in args:
            config = module.get_config(arg)
            assert set(config.mesh.keys()) == {"data", "fsdp", "expert", "tensor"}
        with pytest.raises(ValueError, match="is not accepted"):
            module.get_config("smok")


def test_evaluate_says_in_one_line_which_override_the_config_lacks(tmp_path):
    """`avalon.tools.evaluate` parses its flags as avalon.main does (avalon/train/cli.py)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "avalon.tools.evaluate",
                        "--config=configs/toy_org.py", "--config.eval.s8=True",
                        f"--workdir={tmp_path}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines == ["avalon.tools.evaluate: --config.eval.s8: no such key in the config (an "
                     "override can only change a key the config file sets)"], lines
