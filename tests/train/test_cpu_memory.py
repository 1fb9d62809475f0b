"""`train.cpu_memory.keep_step_memory`: a jitted step with large temporaries faults its memory in
again at every call with JAX's defaults and not once the setting is on, counted in fresh
processes (the setting is process-wide and must precede JAX's CPU client)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, resource, sys
import jax, jax.numpy as jnp
applied = None
if sys.argv[1] == "keep":
    from avalon.train.cpu_memory import keep_step_memory
    applied = keep_step_memory()

@jax.jit
def step(x, w):  # [16384, 4096] and [16384, 1024] temporaries (256 + 64 MB), a scalar out
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.tanh(h @ w.T) * x)

x = jnp.full((16384, 1024), 0.01, jnp.float32)
w = jnp.full((1024, 4096), 0.001, jnp.float32)
want = float(step(x, w)); step(x, w).block_until_ready()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    got = float(step(x, w))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": sorted(faults)[2], "same": got == want}))
"""


def _run(mode: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.serial  # page faults of fresh processes: beside other work it counted 3,775 and 1
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_step_memory_is_kept_between_calls():
    default, kept = _run("default"), _run("keep")
    pages = (16 << 20) // 4096  # 16 MB of pages faulted in anew at every call, at least
    assert default["faults"] >= pages, default
    assert kept["applied"] is True
    assert kept["faults"] < pages // 50, kept
    assert default["same"] and kept["same"]
