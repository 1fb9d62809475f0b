"""Multi-host start-up: `jax.distributed.initialize` from flags or the environment.

Order of precedence: explicit arguments (the `--coordinator`, `--num_processes`, `--process_id`
flags), then `AVALON_COORDINATOR` / `AVALON_NUM_PROCESSES` / `AVALON_PROCESS_ID`, then, with
`auto=True`, JAX's own cluster detection (TPU pods, SLURM, GKE). A single process needs none.

On CPU (tests: two processes on localhost), cross-process collectives go through gloo.
Each process then runs the organisation simulators for its share of the task groups
(`host_shard`) and contributes its rollouts to the global batch.
"""

from __future__ import annotations

import dataclasses
import os

import jax


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    process_id: int
    num_processes: int

    @property
    def is_main(self) -> bool:
        return self.process_id == 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: must be an integer") from None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> ProcessInfo:
    """Start the distributed runtime if this is a multi-process run; returns who we are."""
    coordinator = coordinator or os.environ.get("AVALON_COORDINATOR") or None
    num_processes = num_processes if num_processes is not None else \
        _env_int("AVALON_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _env_int("AVALON_PROCESS_ID")
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ValueError("distributed start-up needs coordinator, num_processes and process_id "
                         f"together; got coordinator={coordinator!r}, "
                         f"num_processes={num_processes!r}, process_id={process_id!r}")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError(f"process_id={process_id} must be in [0, num_processes="
                             f"{num_processes})")
        if num_processes > 1:
            # Only affects the CPU backend; must be set before any backend is touched.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=num_processes, process_id=process_id)
    elif auto:
        jax.distributed.initialize()
    return ProcessInfo(process_id=jax.process_index(), num_processes=jax.process_count())


def host_shard(items: list, info: ProcessInfo) -> list:
    """This process's contiguous share of `items` (every process gets the same count when
    len(items) divides evenly; the driver checks that it does)."""
    n = len(items)
    per = -(-n // info.num_processes)
    return items[info.process_id * per:(info.process_id + 1) * per]
