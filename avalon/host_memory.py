"""The host C library's allocator, set once per process so XLA:CPU's buffers are not
faulted in again on every call of a program.

XLA:CPU allocates a program's buffers with `posix_memalign` on its PjRt worker threads. glibc
gives those threads arenas of their own, whose heaps hold at most 64 MB, so every larger buffer
(and with the default thresholds every buffer over 32 MB) is a fresh `mmap` that `free`
returns to the kernel: each call touches its buffers as new, zeroed pages. Issue 22's model
(`experiments/bench/vs_torch.py`, one core) faulted 307,660 pages (1.2 GB) per update step,
0.55 s of its 3.6 s in the kernel, and ~1.5 s when another program ran in the process between
two steps (as the trainer alternates the engine and the update step).

`keep_freed_memory` makes every thread allocate from the main arena (`M_ARENA_MAX` 1), from
its heap only (`M_MMAP_MAX` 0), and keeps up to 2 GiB of freed memory at the heap's top
(`M_TRIM_THRESHOLD`): from the first calls on, a program's buffers land on pages the process
holds (update step 3.6 -> 3.0 s alone, 4.6 -> 3.2 s alternating with another program). The
costs: the process keeps its peak heap (the toy's smoke run: 3.5-4.2 GB peak RSS against
3.7 GB), and threads that allocate at once wait on one arena's lock, which makes XLA's
compilation on two cores ~25% slower (on one core no slower). So long runs take it
(`avalon.main` calls it first thing) and the library does not impose it on import.

Call it before JAX starts its threads: a thread picks its arena at its first allocation, so
the arena limit binds only threads that have not allocated yet. A process started with
allocator settings of its own (`MALLOC_*` variables, or `GLIBC_TUNABLES` naming a malloc
tunable) keeps them, and `AVALON_SYSTEM_MALLOC=1` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt(3) parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

# Freed memory at the heap's top beyond this goes back to the kernel (mallopt takes an int).
TRIM_THRESHOLD = 2**31 - 1

SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))

# Set to 1 in a process's environment to keep glibc's default allocator settings.
OPT_OUT = "AVALON_SYSTEM_MALLOC"


def user_allocator_settings(environ) -> bool:
    """True when the process was started with allocator settings of its own, or opted out."""
    return (environ.get(OPT_OUT) == "1" or any(k.startswith("MALLOC_") for k in environ)
            or "malloc" in environ.get("GLIBC_TUNABLES", ""))


def keep_freed_memory(environ=os.environ) -> bool:
    """Applies `SETTINGS` with mallopt(3) on Linux with glibc; returns whether it did
    (False elsewhere, or when the process set its own allocator or opted out)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if user_allocator_settings(environ):
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)
