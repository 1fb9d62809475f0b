"""The host allocator settings (`avalon.host_memory`): a jitted program's buffers land on pages
the process already holds, against glibc's defaults in a process that opted out; and
`avalon.main` applies them."""

import json
import os
import platform
import subprocess
import sys

import pytest

from avalon import host_memory

# A jitted program whose 48 MiB output is a fresh buffer on every call: above glibc's largest
# mmap threshold (32 MiB), so with the defaults every call maps, touches and unmaps it.
PROGRAM = """
import json, resource
from avalon import host_memory
kept = host_memory.keep_freed_memory()  # first, as avalon.main
import jax, jax.numpy as jnp
f = jax.jit(lambda x: x * 2.0)
x = jnp.ones((12 * 2**20,), jnp.float32)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # the heap grows until the buffers freed behind each call come back
    f(x).block_until_ready()
f0 = faults()
for _ in range(10):
    f(x).block_until_ready()
print(json.dumps({"kept": kept, "faults_per_call": (faults() - f0) / 10}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt(3) settings are glibc's")


def run_program(opt_out: bool) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["JAX_PLATFORMS"] = "cpu"
    env.pop(host_memory.OPT_OUT, None)
    if opt_out:
        env[host_memory.OPT_OUT] = "1"
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_jitted_buffers_reuse_held_pages():
    kept, default = run_program(opt_out=False), run_program(opt_out=True)
    assert kept["kept"] and not default["kept"]
    pages = 12 * 2**20 * 4 // os.sysconf("SC_PAGE_SIZE")
    # glibc's defaults: every call faults the whole output in again.
    assert default["faults_per_call"] >= 0.9 * pages, default
    # Kept: the same calls run on pages the process holds.
    assert kept["faults_per_call"] <= 0.02 * pages, kept


@pytest.mark.parametrize("environ", [{host_memory.OPT_OUT: "1"}, {"MALLOC_ARENA_MAX": "4"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}])
def test_a_process_s_own_allocator_settings_win(environ):
    assert host_memory.user_allocator_settings(environ)
    assert not host_memory.keep_freed_memory(environ)


def test_no_settings_of_its_own():
    assert not host_memory.user_allocator_settings({"GLIBC_TUNABLES": "glibc.cpu.x86_ibt=on",
                                                    host_memory.OPT_OUT: "0"})


def test_main_keeps_freed_memory_first(monkeypatch):
    """`avalon.main` applies the settings before anything else of the run (before the
    distributed start-up, which brings up JAX's backend and its threads)."""
    from avalon import main

    class Applied(Exception):
        pass

    def keep_freed_memory():
        raise Applied

    monkeypatch.setattr(main.host_memory, "keep_freed_memory", keep_freed_memory)
    with pytest.raises(Applied):
        main.main(["avalon.main"])
