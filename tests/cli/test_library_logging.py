"""XLA's C++ log stays off the console unless `--verbose` (`avalon/command.py`): a compile that
logs an E-level line (here the dump directory cannot be made; on a long run, "Very slow
compile?" banners) prints nothing through `command.run`, whether jax was imported before it
or after, prints it with `--verbose`, and a TF_CPP_MIN_LOG_LEVEL the user set is left alone."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A program's start-up as the entry points do it: `command.run`, jax imported after (or
# before, with --jax-first).
PROGRAM = """
import sys
if "--jax-first" in sys.argv:  # as the tools that import jax at module level
    import jax
from avalon import command
def body():
    import jax
    import jax.numpy as jnp
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(3)).block_until_ready()
    print("ran")
command.run("probe", body, argv=sys.argv[1:])
"""
C_LOG = "Could not create directory"  # XLA's dump.cc, E level


def _run(tmp_path, *args, **env):
    blocker = tmp_path / "a_file"  # a dump directory under a file cannot be made
    blocker.write_text("")
    base = {k: v for k, v in os.environ.items()
            if k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_LOGGING_LEVEL")}
    r = subprocess.run([sys.executable, "-c", PROGRAM, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=600,
                       env={**base, "JAX_PLATFORMS": "cpu",
                            "XLA_FLAGS": f"--xla_dump_to={blocker}/dump", **env})
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr[-2000:]
    return r.stderr


@pytest.mark.parametrize("args, env, logged", [
    ((), {}, False),
    (("--jax-first",), {}, False),
    (("--verbose",), {}, True),
    ((), {"TF_CPP_MIN_LOG_LEVEL": "2"}, True),  # the user's own level wins
])
def test_xla_c_log_only_with_verbose(tmp_path, args, env, logged):
    assert (C_LOG in _run(tmp_path, *args, **env)) is logged
