"""Compiled programs against the kernel's limit on a process's memory maps.

XLA:CPU's JIT gives every compiled kernel maps of its own (4 KB of code, 4 KB of read-only
data, 12 KB of data: three maps), so a compiled program holds ~500 maps (an engine program of
the toy) to ~1,900 (the toy's update step) for as long as it stays cached. A long run compiles
new shapes as it goes (the engine's row, chunk and width buckets, the update step's batch
sizes) and keeps them all: the toy's README run held 33K maps at RLCR step 11 and runs of the
older code 65K-71K by step 51-67. Past Linux's `vm.max_map_count` (65,530 by default) the next
compile aborts the process in LLVM ("Unable to allocate section memory", RESULTS.md).

`release_near_limit` is called between the run's phases. Under `RELEASE_AT` of the limit it
only counts; past it, it drops the engine's compiled programs and, if that is not enough,
every compiled program of the process (`jax.clear_caches`): they compile again when next
used (seconds to a minute each on a laptop), which is slower but never fatal. On hosts without
`/proc` (macOS) it does nothing.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import jax

MAPS_FILE = "/proc/self/maps"
LIMIT_FILE = "/proc/sys/vm/max_map_count"

# Share of the limit past which compiled programs are dropped. One RLCR step of the toy with
# new shapes, or its evaluation, compiles up to ~15K maps' worth: the rest of the limit (19.6K
# at the default) is the margin for that.
RELEASE_AT = 0.7


def count_maps(path: str = MAPS_FILE) -> int | None:
    """The process's memory maps (lines of /proc/self/maps); None where there is no /proc."""
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def map_limit(path: str = LIMIT_FILE) -> int | None:
    """The kernel's limit on one process's maps (vm.max_map_count); None where unknown."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def release_near_limit(release_engine: Callable[[], None], *, limit: int | None = None,
                       count: Callable[[], int | None] = count_maps, stream=sys.stderr) -> dict:
    """Drop compiled programs when the process's maps pass `RELEASE_AT` of the limit.

    release_engine: drops the engine's own program caches (the first, cheaper step).
    limit: the limit to hold to (default: the kernel's, from `LIMIT_FILE`).
    count: the process's maps now (default: `count_maps`).
    Returns metrics: `host/memory_maps` (the count on return) and, when anything was dropped,
    `host/memory_maps_before_release` and `host/programs_released` (1: the engine's, 2: all).
    """
    maps = count()
    limit = map_limit() if limit is None else limit
    if maps is None or limit is None:
        return {}
    threshold = int(RELEASE_AT * limit)
    if maps < threshold:
        return {"host/memory_maps": maps}
    before, level = maps, 1
    release_engine()
    gc.collect()
    maps = count()
    if maps >= threshold:
        level = 2
        jax.clear_caches()
        gc.collect()
        maps = count()
    what = "the engine's compiled programs" if level == 1 else "every compiled program"
    # On a line of its own: the progress bar redraws its line with a carriage return.
    print(f"\navalon: {before:,} memory maps of the kernel's limit of {limit:,} "
          f"(vm.max_map_count): dropped {what}, now {maps:,} maps; they compile again when "
          "next used. A higher vm.max_map_count avoids the recompiles.", file=stream)
    return {"host/memory_maps": maps, "host/memory_maps_before_release": before,
            "host/programs_released": level}
