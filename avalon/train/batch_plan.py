"""Batch arithmetic from the mesh: how many rows an update call takes, and why.

One function, `row_axes`, says which mesh axes split a batch's rows under each parallelism
(the update step's rules table, `rl.update.train_rules`: data x fsdp x expert, or data x fsdp
under sequence parallelism, where each row's positions go over `expert`). Everything that
sizes a batch reads it through `plan`: the SFT batches (`train/sft.py`), the RL batch's padding
and split into update calls (`train/loop.py`), and the AOT tool's compile shape
(`experiments/scale/aot.py`), so the pod's fit is measured at the batch the loop builds.

An update call's rows: a multiple of `micro_batches x row devices` (each micro-batch puts
whole rows on every row-splitting device) and of `rollout.seq_bucket` (fewer compiled shapes).
With `rollout.max_update_rows` set, a call never takes more: an RL step whose rollouts pack into
more rows runs several updates of exactly that many rows (each a full optimizer step over its
share of the step's rows, in packing order), so the update step compiles once, at the shape the
AOT tool measured. Without it (0) one call takes every row, padded up to the multiple.

`check` refuses every batch/mesh mismatch at start-up (from `train.config.from_config_dict`),
before any teacher episode or rollout is played, with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from avalon.sharding import TRAIN_RULES, TRAIN_SEQ_RULES


def row_axes(mesh_shape: Mapping[str, int], sequence_parallel: bool) -> tuple[str, ...]:
    """The mesh axes (of size > 1) that split a training batch's rows: the `batch` rule of the
    update step's table (TRAIN_SEQ_RULES under sequence parallelism, else TRAIN_RULES)."""
    rule = (TRAIN_SEQ_RULES if sequence_parallel else TRAIN_RULES)["batch"]
    axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
    return tuple(a for a in axes if mesh_shape.get(a, 1) > 1)


def seq_axes(mesh_shape: Mapping[str, int], sequence_parallel: bool) -> tuple[str, ...]:
    """The mesh axes (of size > 1) that split each row's positions (sequence parallelism)."""
    rule = (TRAIN_SEQ_RULES if sequence_parallel else TRAIN_RULES)["act_seq"]
    axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
    return tuple(a for a in axes if mesh_shape.get(a, 1) > 1)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The rows of one update call (see the module docstring)."""

    micro_batches: int
    row_devices: int  # devices a batch's rows are split over (product of `row_axes`)
    seq_devices: int  # devices each row's positions are split over (sequence parallelism)
    num_processes: int
    seq_len: int
    multiple: int  # an update call's rows are a multiple of this
    max_rows: int  # rows of one update call at most (0: no cap, one call per step)
    # Length rungs of an update call: seq_len, seq_len / 2, ... (this many; 1: every call
    # takes seq_len positions). A call takes the shortest rung its rows' real tokens fit.
    length_rungs: int = 1

    @property
    def local_multiple(self) -> int:
        """Rows each process contributes per `multiple` (the batch is assembled from the
        processes' shares in process order)."""
        return self.multiple // self.num_processes

    def rows_for(self, local_rows: int) -> int:
        """Global rows of one update call when the busiest process packed `local_rows`."""
        rows = max(1, -(-local_rows // self.local_multiple)) * self.multiple
        return min(rows, self.max_rows) if self.max_rows else rows

    def update_calls(self, local_rows: int) -> int:
        """Update calls an RL step takes when the busiest process packed `local_rows`."""
        per_call = self.rows_for(local_rows) // self.num_processes
        return max(1, -(-local_rows // per_call))

    def calls(self, local_rows: int) -> tuple[int, int]:
        """(update calls, this process's rows per call) when the busiest process packed
        `local_rows`: the loop pads its rows to calls x rows per call and runs each slice."""
        return self.update_calls(local_rows), self.rows_for(local_rows) // self.num_processes

    def call_length(self, used: int) -> int:
        """Positions of an update call whose rows' real tokens end by position `used`: the
        shortest of the plan's length rungs that holds them (each rung a compiled shape)."""
        n = self.seq_len
        for _ in range(self.length_rungs - 1):
            half = n // 2
            if half < used or half % self.seq_devices or half < 1:
                break
            n = half
        return n

    @property
    def aot_rows(self) -> int:
        """The rows the AOT tool compiles: a capped plan's one shape, else the smallest call."""
        return self.max_rows or self.multiple


def plan(mesh_shape: Mapping[str, int], *, micro_batches: int, sequence_parallel: bool,
         seq_len: int, seq_bucket: int = 1, max_rows: int = 0,
         num_processes: int = 1, length_rungs: int = 1) -> BatchPlan:
    """The batch plan of an update step on `mesh_shape` (no check: see `check`)."""
    rows = math.prod(mesh_shape.get(a, 1) for a in row_axes(mesh_shape, sequence_parallel))
    seqs = math.prod(mesh_shape.get(a, 1) for a in seq_axes(mesh_shape, sequence_parallel))
    multiple = math.lcm(micro_batches * rows, seq_bucket, num_processes)
    return BatchPlan(micro_batches=micro_batches, row_devices=rows, seq_devices=seqs,
                     num_processes=num_processes, seq_len=seq_len, multiple=multiple,
                     max_rows=max_rows, length_rungs=length_rungs)


def rl_plan(cfg, num_processes: int = 1) -> BatchPlan:
    """The RL update's plan of a `TrainConfig`."""
    return plan(cfg.mesh, micro_batches=cfg.rl.micro_batches,
                sequence_parallel=cfg.rl.sequence_parallel, seq_len=cfg.rollout.seq_len,
                seq_bucket=cfg.rollout.seq_bucket, max_rows=cfg.rollout.max_update_rows,
                num_processes=num_processes, length_rungs=cfg.rollout.update_length_rungs)


def sft_micro_batches(cfg) -> int:
    """The SFT step's micro-batches: `sft.micro_batches`, or the RL step's when 0."""
    return cfg.sft.micro_batches or cfg.rl.micro_batches


def sft_plan(cfg, num_processes: int = 1) -> BatchPlan:
    """The SFT update's plan: every call takes exactly `sft.batch_seqs` rows."""
    return plan(cfg.mesh, micro_batches=sft_micro_batches(cfg),
                sequence_parallel=cfg.rl.sequence_parallel, seq_len=cfg.rollout.seq_len,
                max_rows=cfg.sft.batch_seqs, num_processes=num_processes)


def check(cfg, num_processes: int = 1) -> None:
    """Refuse a batch that cannot be laid out on the mesh (ValueError naming the field)."""
    rl, sp = cfg.rl, cfg.rl.sequence_parallel
    rows = math.prod(cfg.mesh.get(a, 1) for a in row_axes(cfg.mesh, sp))
    seqs = math.prod(cfg.mesh.get(a, 1) for a in seq_axes(cfg.mesh, sp))
    axes = " x ".join(row_axes(cfg.mesh, sp)) or "no axis"
    where = (f"rows split over {axes} = {rows} device(s)"
             + (" (sequence parallel: positions over expert)" if sp else ""))
    if cfg.rollout.seq_len % seqs:
        raise ValueError(f"config.rollout.seq_len={cfg.rollout.seq_len}: must be a multiple of "
                         f"the {seqs} devices each row's positions are split over "
                         "(rl.sequence_parallel)")
    if num_processes > 1 and rows % num_processes:
        raise ValueError(f"config.mesh={dict(cfg.mesh)}: {where}, which the {num_processes} "
                         "processes cannot share evenly (each process packs its own rows); "
                         "split rows over data or fsdp across the processes")
    if cfg.sft.steps and cfg.sft.batch_seqs % (sft_micro_batches(cfg) * rows):
        field = "sft.micro_batches" if cfg.sft.micro_batches else "rl.micro_batches"
        raise ValueError(f"config.sft.batch_seqs={cfg.sft.batch_seqs}: must be a multiple of "
                         f"{field}={sft_micro_batches(cfg)} x {rows} = "
                         f"{sft_micro_batches(cfg) * rows} ({where})")
    if cfg.sft.steps and cfg.sft.batch_seqs % num_processes:
        raise ValueError(f"config.sft.batch_seqs={cfg.sft.batch_seqs}: must be a multiple of the "
                         f"{num_processes} processes")
    p = rl_plan(cfg, num_processes)
    cap = cfg.rollout.max_update_rows
    if cap and cap % p.multiple:
        raise ValueError(f"config.rollout.max_update_rows={cap}: must be a multiple "
                         f"of rl.micro_batches={rl.micro_batches} x {rows} ({where}), "
                         f"rollout.seq_bucket={cfg.rollout.seq_bucket} and the "
                         f"{num_processes} process(es): {p.multiple}")
