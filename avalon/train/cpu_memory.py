"""Keep an XLA:CPU step's temporary memory from one step to the next (a process setting).

XLA:CPU allocates each execution's temporaries as one block (1.2 GB for vs_torch's 13.6M
Nemotron-H's update step) with `malloc` on the thread that runs it. With JAX's default asynchronous
dispatch that is a worker thread, whose glibc arena serves a block that large by `mmap` and hands it
back to the kernel at `free`, so every step faults all of it in again as fresh zeroed pages: 307,660
minor faults (1.2 GB) a step, ~15% of its time on one core (experiments/bench/RESULTS.md, "The
update step's page faults"). Running executions on the calling thread
(`jax_cpu_enable_async_dispatch=False`) puts the allocation in glibc's main arena, and with `mmap`
off for it and a 2 GiB trim threshold the block stays in the heap between steps: 0 faults and 1.21x
the step's speed (one core; 3.51 -> 2.91 s). Either setting alone changes nothing. Unlike limiting
glibc to one arena (also tried), neither serialises the compiler's threads.

`keep_step_memory()` must run before JAX creates its CPU client (the dispatch flag is read
then). The glibc part applies only when JAX's default backend is the CPU and the C library is
glibc; on an accelerator host the process keeps its allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import jax

ASYNC_DISPATCH_FLAG = "jax_cpu_enable_async_dispatch"
# glibc's mallopt parameters (malloc.h) and the values set.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 2**31 - 1


def _glibc_mallopt():
    """glibc's `mallopt`, or None where the C library is not glibc (macOS, musl)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        version = libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError):
        return None
    del version
    return libc.mallopt


def keep_step_memory() -> bool:
    """Run XLA:CPU executions on the calling thread and, on a CPU run with glibc, keep freed
    memory in the heap (see the module docstring). Returns whether the glibc part applied."""
    jax.config.update(ASYNC_DISPATCH_FLAG, False)
    if jax.default_backend() != "cpu":
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
