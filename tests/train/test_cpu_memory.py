"""`train.cpu_memory.keep_step_memory`: a jitted step with large temporaries, run on the calling
thread with glibc's defaults, faults its memory in again at every call, and not once the setting
is on; counted in fresh processes (the setting is process-wide and must precede JAX's CPU client).

The reference is the dispatch setting alone, not JAX's defaults: with asynchronous dispatch the
count depends on which thread's glibc arena serves the block, and fresh processes on a quiet
machine counted anything from 1 to 8,516 faults a call (a CI run failed on a 1)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, resource, sys
import jax, jax.numpy as jnp
applied = None
if sys.argv[1] == "calling_thread":  # the dispatch part of the setting alone
    jax.config.update("jax_cpu_enable_async_dispatch", False)
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
@pytest.mark.serial  # page faults of fresh processes, counted with the machine to itself
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_step_memory_is_kept_between_calls():
    default, kept = _run("calling_thread"), _run("keep")
    pages = (16 << 20) // 4096  # 16 MB of pages faulted in anew at every call, at least
    assert default["faults"] >= pages, default
    assert kept["applied"] is True
    assert kept["faults"] < pages // 50, kept
    assert default["same"] and kept["same"]
