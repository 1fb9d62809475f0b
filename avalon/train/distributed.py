"""Multi-host start-up: `jax.distributed.initialize` from flags or the environment.

Order of precedence: explicit arguments (the `--coordinator`, `--num_processes`, `--process_id`
flags), then `AVALON_COORDINATOR` / `AVALON_NUM_PROCESSES` / `AVALON_PROCESS_ID`, then, with
`auto=True`, JAX's own cluster detection (TPU pods, SLURM, GKE). A single process needs none.

On CPU (tests: two processes on localhost), cross-process collectives go through gloo.
Each process then runs the organisation simulators for its share of the task groups
(`host_shard`, even shares) and contributes its rollouts to the global batch; evaluation and
teacher episodes are shared out the same way, and what every process needs of the others'
results travels through `allgather_bytes` (in process order, so every process computes the
same thing from it).
"""

from __future__ import annotations

import dataclasses
import io
import json
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
            # XLA:CPU gives every process 30 s to arrive at a collective (its gloo context's
            # first use included): a process still compiling, or still playing a longer share,
            # failed the run on a loaded host ("Gloo context initialization failed").
            flags = os.environ.get("XLA_FLAGS", "")
            if "xla_cpu_collective_timeout_seconds" not in flags:
                os.environ["XLA_FLAGS"] = (f"{flags} --xla_cpu_collective_timeout_seconds="
                                           f"{int(BARRIER_TIMEOUT_S)}").strip()
            # Explicit processes are CPU runs (tests, laptops): on a loaded host a compile can
            # starve the heartbeat threads past JAX's 100 s and end the job.
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=num_processes, process_id=process_id,
                                       heartbeat_timeout_seconds=600)
    elif auto:
        jax.distributed.initialize()
    return ProcessInfo(process_id=jax.process_index(), num_processes=jax.process_count())


def share_bounds(n: int, info: ProcessInfo) -> tuple[int, int]:
    """[lo, hi) of this process's contiguous share of n items: shares differ by at most one
    (the first n % P processes take one more), and a process whose share is empty idles."""
    base, extra = divmod(n, info.num_processes)
    lo = info.process_id * base + min(info.process_id, extra)
    return lo, lo + base + (info.process_id < extra)


def host_shard(items: list, info: ProcessInfo) -> list:
    """This process's contiguous share of `items` (`share_bounds`: 200 groups over 32 hosts
    are 8 shares of 7 and 24 of 6; 3 over 4 leave one host empty)."""
    lo, hi = share_bounds(len(items), info)
    return items[lo:hi]


# How long a process waits at `barrier` for the others: hosts play uneven shares of a step
# (minutes apart on a pod); a process that died is reported by the coordination service's
# heartbeats long before this.
BARRIER_TIMEOUT_S = 6 * 3600
_barriers = 0


def barrier(name: str) -> None:
    """Wait until every process reaches this point (nothing on one process). Collectives after
    uneven host work go through one first: XLA:CPU's gloo gives a collective's first use on a
    set of devices 30 s for every process to arrive, and a host that took longer to play its
    share (or to compile, on a loaded machine) otherwise fails the run."""
    global _barriers
    if jax.process_count() == 1:
        return
    from jax._src import distributed as jax_distributed
    _barriers += 1
    jax_distributed.global_state.client.wait_at_barrier(f"avalon/{name}/{_barriers}",
                                                        int(BARRIER_TIMEOUT_S * 1000))


def open_collectives(mesh) -> None:
    """Connect every process's devices for the collectives the update steps run on `mesh`
    before any of them runs (nothing on one process). XLA:CPU opens a gloo connection per set
    of devices at a collective's first use and gives every process 30 s to join it (a fixed
    timeout, not `xla_cpu_collective_timeout_seconds`); a barrier before a step does not
    help, because the step compiles after it, and on a loaded host one process compiled the
    SFT step more than 30 s after the other ("Gloo context initialization failed:
    DEADLINE_EXCEEDED ... GetKeyValue() timed out"). Here one small all-reduce per set of
    mesh axes (the device groups a collective over those axes uses) is compiled first, then
    every process waits at a barrier and runs them: the connections open within moments of
    each other and are reused by every later program on the same devices."""
    if jax.process_count() == 1:
        return
    import itertools

    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    axes = [a for a in mesh.axis_names if mesh.shape[a] > 1]
    spec = PartitionSpec(tuple(mesh.axis_names))
    sharding = NamedSharding(mesh, spec)
    x = jax.make_array_from_callback((mesh.devices.size,), sharding,
                                     lambda index: np.ones(1, np.float32))
    programs = []
    for n in range(1, len(axes) + 1):
        for group in itertools.combinations(axes, n):
            total = jax.shard_map(lambda v, g=group: jax.lax.psum(v, g), mesh=mesh,
                                  in_specs=spec, out_specs=spec)
            programs.append(jax.jit(total).lower(x).compile())
    barrier("open_collectives")
    for program in programs:
        program(x).block_until_ready()


# Bytes per process per collective in `allgather_bytes`: on an accelerator the gather runs
# through device memory (P x this per device), so a large payload goes in pieces.
_GATHER_CHUNK = 1 << 24


def allgather_bytes(payload: bytes) -> list[bytes]:
    """Every process's `payload`, in process order (just `[payload]` on one process). Every
    process must call it, the same number of times, in the same order."""
    if jax.process_count() == 1:
        return [payload]
    import numpy as np
    from jax.experimental import multihost_utils
    barrier("allgather")  # the processes come from uneven work (their shares)

    sizes = [int(n) for n in multihost_utils.process_allgather(np.asarray(len(payload),
                                                                          np.int64))]
    pieces: list[list[bytes]] = [[] for _ in sizes]
    for start in range(0, max(sizes), _GATHER_CHUNK):
        buf = np.zeros(min(_GATHER_CHUNK, max(sizes) - start), np.uint8)
        mine = np.frombuffer(payload[start:start + len(buf)], np.uint8)
        buf[:len(mine)] = mine
        got = multihost_utils.process_allgather(buf)
        for p, n in enumerate(sizes):
            pieces[p].append(bytes(got[p][:max(0, min(len(buf), n - start))]))
    return [b"".join(parts) for parts in pieces]


def max_across_hosts(n: int) -> int:
    """The largest `n` of any process (`n` on one process)."""
    if jax.process_count() == 1:
        return int(n)
    import numpy as np
    from jax.experimental import multihost_utils
    barrier("max_across_hosts")  # the hosts come from uneven rollouts
    return int(max(multihost_utils.process_allgather(np.asarray(n, np.int64))))


def sum_across_hosts(n: int) -> int:
    """The sum of every process's `n` (`n` on one process)."""
    if jax.process_count() == 1:
        return int(n)
    import numpy as np
    from jax.experimental import multihost_utils
    barrier("sum_across_hosts")
    return int(sum(multihost_utils.process_allgather(np.asarray(n, np.int64))))


def allgather_json(value) -> list:
    """Every process's JSON-able `value`, in process order."""
    return [json.loads(b.decode()) for b in allgather_bytes(json.dumps(value).encode())]


def encode_rows(rows: list, tags: list[int]) -> bytes:
    """`TrajectoryRow`s (each with an int tag) as one npz payload (no pickle)."""
    import numpy as np
    arrays = {"tags": np.asarray(tags, np.int64)}
    meta = []
    for i, r in enumerate(rows):
        for name in ("tokens", "loss_mask", "sampler_logp", "flags", "routing"):
            value = getattr(r, name)
            if value is not None:
                arrays[f"{i}.{name}"] = np.asarray(value)
        meta.append([r.agent, r.role, r.segment])
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def decode_rows(payload: bytes) -> tuple[list, list[int]]:
    """The inverse of `encode_rows`: (rows, tags)."""
    import numpy as np

    from avalon.rl.types import TrajectoryRow
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        rows = [TrajectoryRow(tokens=z[f"{i}.tokens"], loss_mask=z[f"{i}.loss_mask"],
                              sampler_logp=z[f"{i}.sampler_logp"], flags=z[f"{i}.flags"],
                              routing=z[f"{i}.routing"] if f"{i}.routing" in z else None,
                              agent=agent, role=role, segment=segment)
                for i, (agent, role, segment) in enumerate(meta)]
        return rows, [int(t) for t in z["tags"]]
