"""Compile a config's real update step for a TPU topology or a GPU from a CPU host; print memory
and cost.

    pip install -e .[aot]        # libtpu matching the jax release (no TPU needed)
    python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py --topology=v5p-256
    python -m experiments.scale.aot --config=configs/gpu_hybrid_2b.py --topology=v5p-8 \\
        --mesh=fsdp=4 --rows=4 --seq=4096

`--topology=h200` compiles for one NVIDIA H200 instead (the `gpu` extra: jax-cuda12-plugin's
compile-only topology, `gpu_target.py`); there the memory is XLA:GPU's buffer assignment
(`memory_analysis`: arguments + outputs - aliased + the preallocated temporaries), against
141 GB, and the decode's JSON adds the trainer's state, which stays on the card while the
engine decodes (`peak_with_trainer_state_bytes_per_chip`).

`jax.experimental.topologies` describes the TPU slice (v5p-N: N TensorCores, N/2 chips) and
its devices build the config's mesh; `make_update_step` (the very step the trainer runs) is
lowered on abstract inputs (`ShapeDtypeStruct`s: no weight is materialised) and compiled by
libtpu. One JSON object is printed:

- per chip: `peak_bytes_per_chip`, the bytes the compiled program's buffer assignment
  allocates in HBM (libtpu's memory-usage report, default memory space: every argument,
  output and temporary allocation, donated state aliased with its output), beside
  `hbm_bytes_per_chip` (v5p: 95 GB) and their ratio. This is the figure libtpu's own
  compile-time check compares with the chip's HBM (its RESOURCE_EXHAUSTED error quotes it as
  "the total memory required"). XLA's memory analysis is printed too
  (`argument/output/alias/temp_bytes_per_chip`, their sum as `memory_analysis_sum_bytes`,
  `xla_peak_memory_in_bytes`): on TPU its temp counts more than the HBM temporaries (VMEM
  scratch and more: 41 GB more on the pod), so its sum over-states what must fit; libtpu
  compiles programs whose sum exceeds the HBM (RESULTS.md, "The pod's update step: a JSON
  line, ...");
- `flops_per_chip`: the compiled program's matmul FLOPs with every loop body weighted by its
  trip count (`hlo_stats`; XLA's own `cost_analysis` counts a loop body once and is printed as
  `cost_analysis_flops_per_chip`), beside `model_flops_per_chip`: the model accounting
  (`train_flops_per_token`, 3 x forward, active experts only, full rows) x tokens / chips;
- `collectives`: per kind, the count and result bytes per chip, trip-count weighted.

The batch is one update call's: `--rows` packed sequences of `--seq` tokens (defaults: the
call the training loop builds, `train.batch_plan`: `rollout.max_update_rows` rows when set, else
`rl.micro_batches` x the devices rows split over; `rollout.seq_len` tokens), with replayed
routing in the narrowest integer type of the expert count, as the trainer packs it.
The config's checkpoint and tokenizer are not read (shapes come from the model preset).

A pod-sized compile needs ~11 GB of host memory at its end (code generation). `--dump_dir=DIR`
keeps the compile's XLA dump in DIR; libtpu writes the memory-usage report and the optimized
HLO there before code generation, so if the host runs out of memory after that, `--from_dump=DIR`
(same config and flags) reports the memory, FLOPs and collectives from them without compiling
(XLA's memory analysis and compile time, which need the finished executable, are left out):

    python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py --topology=v5p-256 \
        --dump_dir=/tmp/pod-dump      # killed in code generation on a 24 GB host, then:
    python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py --topology=v5p-256 \
        --from_dump=/tmp/pod-dump

`--step=decode` compiles one host's decode dispatch instead (`inference.device.decode`, what
the engine runs: `engine.steps_per_dispatch` tokens for `--rows` rows of `--slots` slots, KV in
a page pool of `--kv_tokens` positions), on the engine's mesh: the host's chips of the config's
mesh (`train.setup.make_local_mesh`), params as the decode view in `engine.decode_dtype`.
The JSON has the same memory fields, and what the weights, the slot state and the pool hold.

    python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py \
        --topology=v5p-256 --step=decode            # the config's slots and pool
    python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py \
        --topology=v5p-256 --step=decode --slots=96 --kv_tokens=2097152
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import sys
import tempfile
import time

import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

LIBTPU_PIN = "libtpu==0.0.42.1"  # the release that matches jax 0.10.2 (setup.py extra `aot`)
V5P_HBM_BYTES = 95e9
_V5P_SHAPES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
               256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}


class AotError(Exception):
    """A one-line reason the compile could not run (missing libtpu, bad topology, ...)."""


def topology_name(topology: str) -> str:
    """'v5p-256' -> 'v5p:4x4x8' (128 chips); 'v5p:2x2x1' passes through."""
    if topology.startswith("v5p:"):
        return topology
    if not topology.startswith("v5p-") or not topology[4:].isdigit():
        raise AotError(f"--topology={topology!r}: use v5p-N (N TensorCores) or v5p:AxBxC")
    chips = int(topology[4:]) // 2
    if chips not in _V5P_SHAPES:
        raise AotError(f"--topology={topology!r}: {chips} chips is not a v5p slice; use one of "
                       + ", ".join(f"v5p-{2 * c}" for c in _V5P_SHAPES))
    return f"v5p:{_V5P_SHAPES[chips]}"


def tpu_devices(topology: str):
    """The devices of a TPU topology, compiled for from this (TPU-less) host."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise AotError(f"libtpu is not importable: pip install '.[aot]' (pins {LIBTPU_PIN}) "
                       "or put a libtpu install on PYTHONPATH") from None
    # Compiling touches no chip, so a second AOT process (a test beside a run) may load libtpu
    # too; without this, libtpu's /tmp lockfile refuses it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    from jax.experimental import topologies
    try:
        topo = topologies.get_topology_desc(topology_name=topology_name(topology),
                                            platform="tpu")
    except Exception as e:  # a libtpu that does not match this jax fails here
        raise AotError(f"libtpu could not describe {topology!r} with jax {jax.__version__} "
                       f"(needs {LIBTPU_PIN}): {str(e).splitlines()[0]}") from None
    return topo.devices


@dataclasses.dataclass(frozen=True)
class Target:
    """What a compile is for: the devices, the memory a chip has, the processes of a run."""

    devices: list
    hbm_bytes: float
    processes: int  # a v5p host drives 4 chips; one GPU is one process


def target(topology: str) -> Target:
    """'v5p-N' / 'v5p:AxBxC' (libtpu) or a GPU name such as 'h200' (jax-cuda12-plugin)."""
    from experiments.scale import gpu_target
    if topology in gpu_target.TARGETS:
        try:
            devices = gpu_target.gpu_devices(topology)
        except gpu_target.GpuTargetError as e:
            raise AotError(str(e)) from None
        return Target(list(devices), gpu_target.TARGETS[topology].hbm_bytes, 1)
    devices = tpu_devices(topology)
    return Target(list(devices), V5P_HBM_BYTES, max(1, len(devices) // 4))


def is_tpu(devices) -> bool:
    return devices[0].platform == "tpu"


def abstract_batch(cfg, rows: int, seq: int, with_routing: bool):
    import jax
    import jax.numpy as jnp

    from avalon.rl.batch import TrainBatch, routing_dtype
    sd = jax.ShapeDtypeStruct
    routing = None
    if with_routing and cfg.count("E"):
        routing = sd((rows, seq, cfg.count("E"), cfg.num_experts_per_tok),
                     routing_dtype(cfg.n_routed_experts))
    return TrainBatch(tokens=sd((rows, seq), jnp.int32), targets=sd((rows, seq), jnp.int32),
                      segment_ids=sd((rows, seq), jnp.int32), loss_mask=sd((rows, seq), bool),
                      old_logp=sd((rows, seq), jnp.float32),
                      advantages=sd((rows, seq), jnp.float32), routing=routing)


def compile_train_step(model_cfg, rl_cfg, mesh_shape: dict, devices, rows: int, seq: int,
                       dump_dir: str | None = None):
    """Lower and compile the update step on abstract state and batch. Returns (compiled,
    seconds, bytes per memory space)."""
    import jax
    import jax.numpy as jnp

    from avalon import sharding
    from avalon.model import abstract_params
    from avalon.rl.config import LossKind
    from avalon.rl.update import TrainState, make_update_step

    mesh = sharding.make_mesh(mesh_shape, devices=devices)
    step = make_update_step(model_cfg, rl_cfg, mesh=mesh)
    params = abstract_params(step.model_cfg)
    state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                       opt_state=jax.eval_shape(step.optimizer.init, params))
    batch = abstract_batch(step.model_cfg, rows, seq, rl_cfg.loss == LossKind.CISPO)
    return compile_with_memory_report(step.step_fn.lower(state, batch), tpu=is_tpu(devices),
                                      dump_dir=dump_dir)


def memory_spaces(report_text: str) -> dict[str, int]:
    """A libtpu memory-usage report (`*memory-usage-report.txt` of an XLA dump) -> bytes
    allocated per memory space: {'default': HBM, 'vmem': ..., ...}."""
    spaces = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^Memory Space: (\S+) \(color=\d+\)\nTotal bytes: (\d+)", report_text, re.M)}
    if "default" not in spaces:
        raise AotError("libtpu's memory-usage report has no default (HBM) memory space")
    return spaces


def dump_options(dump_dir: str) -> dict[str, str]:
    """`compile(compiler_options=...)` that dump one compile (no per-pass HLO) to `dump_dir`,
    libtpu's memory-usage report among its files."""
    return {"xla_dump_to": dump_dir, "xla_dump_hlo_pass_re": "NONE"}


def compile_with_memory_report(lowered, tpu: bool = True, dump_dir: str | None = None):
    """Compile `lowered`, dumped to a temporary directory (or `dump_dir`, kept) for libtpu's
    memory-usage report. Returns (compiled, seconds, bytes per memory space). On a GPU the
    program's memory is its buffer assignment as XLA's memory analysis gives it (arguments +
    outputs - aliased + the one preallocated temporary buffer), reported as the default
    space."""
    if not tpu:
        start = time.perf_counter()
        compiled = lowered.compile()
        seconds = time.perf_counter() - start
        mem = compiled.memory_analysis()
        return compiled, seconds, {"default": int(
            mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
            + mem.temp_size_in_bytes)}
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        if os.listdir(dump_dir):
            raise AotError(f"--dump_dir={dump_dir}: not empty (one compile's dump per directory)")
    with tempfile.TemporaryDirectory(prefix="avalon-aot-") as tmp:
        dump = dump_dir or tmp
        start = time.perf_counter()
        compiled = lowered.compile(compiler_options=dump_options(dump))
        seconds = time.perf_counter() - start
        spaces = memory_spaces(_read_one(dump, "*memory-usage-report.txt"))
    return compiled, seconds, spaces


def _read_one(dump: str, pattern: str) -> str:
    found = glob.glob(os.path.join(dump, pattern))
    if len(found) != 1:
        raise AotError(f"expected one {pattern} in the XLA dump {dump}, found {len(found)}: "
                       f"is this libtpu {LIBTPU_PIN}, and the dump one compile's?")
    with open(found[0]) as f:
        return f.read()


def dump_report(dump: str, model_cfg, rows: int, seq: int, chips: int,
                hbm_bytes: float = V5P_HBM_BYTES) -> dict:
    """`report`'s memory, FLOPs and collectives from a kept XLA dump of the same compile
    (`--dump_dir`): libtpu's memory-usage report and the optimized HLO, both written before
    code generation. The dump's module must be this batch on this many chips."""
    from avalon.model.accounting import train_flops_per_token
    from experiments.scale import hlo_stats

    module = _read_one(dump, "*/module.mlir")
    batch = f"tensor<{rows}x{seq}xi32>"
    partitions = re.search(r"mhlo\.num_partitions = (\d+)", module)
    if batch not in module or not partitions or int(partitions.group(1)) != chips:
        raise AotError(f"--from_dump={dump}: its module is not a batch of {rows} x {seq} tokens "
                       f"on {chips} chips (num_partitions "
                       f"{partitions.group(1) if partitions else '?'}): same config and flags?")
    spaces = memory_spaces(_read_one(dump, "*memory-usage-report.txt"))
    stats = hlo_stats.analyse(_read_one(dump, "*.after_optimizations.txt"))
    peak = spaces["default"]
    model_flops = train_flops_per_token(model_cfg, seq) * rows * seq / chips
    return {
        "chips": chips, "rows": rows, "seq": seq, "tokens": rows * seq, "from_dump": dump,
        "peak_bytes_per_chip": peak, "hbm_bytes_per_chip": hbm_bytes,
        "peak_fraction_of_hbm": round(peak / hbm_bytes, 4),
        "memory_space_bytes_per_chip": spaces,
        "flops_per_chip": stats.flops, "collectives": stats.collectives,
        "unknown_trip_loops": stats.unknown_trip_loops,
        "model_flops_per_chip": model_flops,
        "flops_ratio": round(stats.flops / model_flops, 4) if model_flops else None,
    }


def report(compiled, model_cfg, rows: int, seq: int, chips: int, compile_s: float,
           spaces: dict[str, int], hbm_bytes: float = V5P_HBM_BYTES) -> dict:
    from avalon.model.accounting import train_flops_per_token

    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}  # None for a compile-only GPU
    compiled_part = compiled_report(compiled, compile_s, spaces, hbm_bytes)
    model_flops = train_flops_per_token(model_cfg, seq) * rows * seq / chips
    flops = compiled_part["flops_per_chip"]
    return {
        "chips": chips,
        "rows": rows, "seq": seq, "tokens": rows * seq,
        **compiled_part,
        "model_flops_per_chip": model_flops,
        "flops_ratio": round(flops / model_flops, 4) if model_flops else None,
        "cost_analysis_flops_per_chip": float(cost.get("flops", math.nan)),
    }


def compiled_report(compiled, compile_s: float, spaces: dict[str, int],
                    hbm_bytes: float = V5P_HBM_BYTES) -> dict:
    """What both steps report of a compiled program: its HBM allocation per chip (`spaces`,
    from `compile_with_memory_report`) against the chip's HBM, XLA's memory analysis,
    matmul FLOPs and collectives from the HLO (`hlo_stats`)."""
    from experiments.scale import hlo_stats

    mem = compiled.memory_analysis()
    stats = hlo_stats.analyse(compiled.as_text())
    peak = spaces["default"]
    return {
        "peak_bytes_per_chip": peak,
        "hbm_bytes_per_chip": hbm_bytes,
        "peak_fraction_of_hbm": round(peak / hbm_bytes, 4),
        "memory_space_bytes_per_chip": spaces,
        "argument_bytes_per_chip": mem.argument_size_in_bytes,
        "output_bytes_per_chip": mem.output_size_in_bytes,
        "alias_bytes_per_chip": mem.alias_size_in_bytes,
        "temp_bytes_per_chip": mem.temp_size_in_bytes,
        "memory_analysis_sum_bytes": (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                      - mem.alias_size_in_bytes + mem.temp_size_in_bytes),
        "xla_peak_memory_in_bytes": mem.peak_memory_in_bytes,
        "generated_code_bytes": mem.generated_code_size_in_bytes,
        "flops_per_chip": stats.flops,
        "collectives": stats.collectives,
        "unknown_trip_loops": stats.unknown_trip_loops,
        "compile_s": round(compile_s, 1),
    }


def compile_decode_step(cfg, devices, slots: int, rows: int, num_pages: int, width: int,
                        page_size: int):
    """Lower and compile one host's decode dispatch (`inference.device.decode`, the program
    the engine runs) on abstract inputs: the decode view of the params in
    `engine.decode_dtype` laid out by DECODE_RULES on the host's mesh (`make_local_mesh` of
    the config's mesh: the engine runs per host), a slot state of `slots` slots whose KV pool
    holds `num_pages` pages, a dispatch of `rows` rows with page tables `width` pages
    wide. Returns (compiled, seconds, bytes per memory space, the host mesh's shape, pool
    pages)."""
    from avalon import sharding
    from avalon.inference import device as dev
    from avalon.inference.weights import abstract_decode_view
    from avalon.train.setup import make_local_mesh

    # The engine's mesh of one host, as the run cuts it: the run's mesh over the whole slice
    # (`sharding.make_mesh` keeps each host's expert x tensor chips on the host), then the
    # chips of this process (process 0).
    local = make_local_mesh(sharding.make_mesh(cfg.mesh, devices=devices))
    setup = dev.Setup(cfg=cfg.model, mesh=local, max_context=cfg.org.window,
                      steps=cfg.engine.steps_per_dispatch, page_size=page_size)
    params = abstract_decode_view(cfg.model, local, dtype=cfg.engine.decode_dtype)
    args = dev.abstract_decode_inputs(setup, slots, num_pages, rows, width)
    compiled, seconds, spaces = compile_with_memory_report(
        dev.decode.lower(params, *args, setup=setup), tpu=is_tpu(devices))
    return compiled, seconds, spaces, dict(local.shape), num_pages


def decode_report(compiled, cfg, slots: int, rows: int, num_pages: int, page_size: int,
                  chips: int, compile_s: float, spaces: dict[str, int],
                  hbm_bytes: float = V5P_HBM_BYTES) -> dict:
    """--step=decode's JSON: the memory of --step=train, plus what the arguments hold."""
    import jax
    import numpy as np

    from avalon.inference import device as dev
    from avalon.inference.weights import abstract_decode_view
    from avalon.model.cache import PagedKV

    nbytes = lambda tree: int(sum(np.prod(a.shape) * a.dtype.itemsize
                                  for a in jax.tree.leaves(tree)))
    setup = dev.Setup(cfg=cfg.model, mesh=None, max_context=cfg.org.window,
                      steps=cfg.engine.steps_per_dispatch, page_size=page_size)
    state = dev.abstract_state(setup, slots, num_pages)
    kv = [e for blk in state.cache.blocks for e in blk.values() if isinstance(e, PagedKV)]
    kv_bytes = nbytes(kv)
    return {
        "chips": chips, "slots": slots, "rows": rows, "steps_per_dispatch": setup.steps,
        "kv_pool_pages": num_pages, "kv_pool_tokens": num_pages * page_size,
        "page_size": page_size,
        # Totals over the host (each sharded over its chips by DECODE_RULES):
        "decode_weights_bytes": nbytes(abstract_decode_view(cfg.model,
                                                            dtype=cfg.engine.decode_dtype)),
        "slot_state_bytes": nbytes(state), "kv_pool_bytes": kv_bytes,
        "per_slot_state_bytes": (nbytes(state) - kv_bytes) // slots,
        **compiled_report(compiled, compile_s, spaces, hbm_bytes),
    }


def run_decode(config, topology: str, slots: int | None = None, rows: int | None = None,
               kv_tokens: int | None = None, page_size: int = 16,
               dump_hlo: str | None = None) -> dict:
    """--step=decode: one host's decode dispatch of `config` (see `compile_decode_step`).
    Defaults: the config's engine.slots, a dispatch over every slot, the largest pool the
    engine can reach (its ceiling engine.max_kv_pages; without one, engine.kv_pages rounded up
    to a power of two, where it starts), page tables a whole window wide (any one context may
    reach it). `kv_tokens` asks for a pool of that many positions instead (a power of two of
    pages, as the engine grows it)."""
    from avalon.inference.pages import pow2_at_least
    from avalon.train.config import from_config_dict

    tgt = target(topology)
    devices = tgt.devices
    chips = len(devices)
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.init_from = ""
        config.tokenizer, config.tokenizer_path = "byte", ""
    cfg = from_config_dict(config, num_devices=chips, num_processes=tgt.processes)
    slots = slots or cfg.engine.slots
    rows = rows or slots
    if kv_tokens is None:
        num_pages = cfg.engine.max_kv_pages or pow2_at_least(cfg.engine.kv_pages)
    else:
        num_pages = pow2_at_least(max(-(-kv_tokens // page_size), 1))
    kv_tokens = num_pages * page_size
    width = -(-cfg.org.window // page_size)
    out = {"topology": topology, "step": "decode", "mesh": cfg.mesh,
           "decode_dtype": cfg.engine.decode_dtype, "window": cfg.org.window}
    try:
        compiled, compile_s, spaces, host_mesh, num_pages = compile_decode_step(
            cfg, devices, slots, rows, num_pages, width, page_size)
    except Exception as e:  # over HBM: the answer, reported
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        out.update({"fits": False, "slots": slots, "rows": rows, "kv_tokens": kv_tokens,
                    "error": str(e).splitlines()[0][:400]})
        return out
    if dump_hlo:
        with open(dump_hlo, "w") as f:
            f.write(compiled.as_text())
    out.update({"fits": True, "host_mesh": host_mesh})
    out.update(decode_report(compiled, cfg, slots, rows, num_pages, page_size,
                             int(np.prod(list(host_mesh.values()))), compile_s, spaces,
                             tgt.hbm_bytes))
    trainer = trainer_state_bytes_per_chip(cfg, devices)
    out["trainer_state_bytes_per_chip"] = trainer
    out["peak_with_trainer_state_bytes_per_chip"] = out["peak_bytes_per_chip"] + trainer
    out["peak_with_trainer_state_fraction_of_hbm"] = round(
        out["peak_with_trainer_state_bytes_per_chip"] / tgt.hbm_bytes, 4)
    return out


def trainer_state_bytes_per_chip(cfg, devices) -> int:
    """Bytes per chip of the trainer's state (fp32 params and AdamW moments, laid out by the
    update step's shardings): it stays on the accelerator while the engine decodes, so a
    decode dispatch fits only beside it (`peak_with_trainer_state_bytes_per_chip`)."""
    import jax
    import numpy as np

    from avalon import sharding
    from avalon.model import abstract_params
    from avalon.rl.update import make_update_step

    step = make_update_step(cfg.model, cfg.rl, mesh=sharding.make_mesh(cfg.mesh, devices=devices))
    params = abstract_params(step.model_cfg)
    opt = jax.eval_shape(step.optimizer.init, params)
    total = 0
    for tree, shards in ((params, step.state_shardings.params),
                         (opt, step.state_shardings.opt_state)):
        for a, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shards)):
            total += int(np.prod(sh.shard_shape(a.shape))) * a.dtype.itemsize
    return total


def parse_mesh(text: str) -> dict[str, int]:
    """'fsdp=4,expert=2' -> {'fsdp': 4, 'expert': 2}."""
    out = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not size.strip().isdigit():
            raise AotError(f"--mesh={text!r}: write axis=size pairs, e.g. fsdp=4,expert=2")
        out[name.strip()] = int(size)
    return out


def train_shape(cfg, loss: str, num_processes: int):
    """(rows, seq, RL config) of the update call the trainer builds for a `TrainConfig`
    (`train.batch_plan`): the RL step's capped shape (`rollout.max_update_rows`; else its
    smallest call) or the SFT step's `sft.batch_seqs`, rows of `rollout.seq_len` tokens."""
    import dataclasses

    from avalon.rl.config import LossKind
    from avalon.train import batch_plan
    if loss == "cispo":
        return batch_plan.rl_plan(cfg, num_processes).aot_rows, cfg.rollout.seq_len, cfg.rl
    sft_rl = dataclasses.replace(cfg.rl, loss=LossKind.SFT, lr=cfg.sft.lr,
                                 micro_batches=batch_plan.sft_micro_batches(cfg))
    return batch_plan.sft_plan(cfg, num_processes).aot_rows, cfg.rollout.seq_len, sft_rl


def run(config, topology: str, rows: int | None, seq: int | None, loss: str,
        mesh: str | None = None, dump_hlo: str | None = None, dump_dir: str | None = None,
        from_dump: str | None = None) -> dict:
    from avalon.train.config import from_config_dict

    tgt = target(topology)
    devices = tgt.devices
    chips = len(devices)
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.init_from = ""  # shapes come from the preset; no checkpoint is read
        config.tokenizer, config.tokenizer_path = "byte", ""
        if mesh:
            config.mesh = ml_collections.ConfigDict(parse_mesh(mesh))
    cfg = from_config_dict(config, num_devices=chips, num_processes=tgt.processes)
    default_rows, seq_len, rl_cfg = train_shape(cfg, loss, num_processes=tgt.processes)
    rows = rows or default_rows
    seq = seq or seq_len
    out = {"topology": topology, "step": "train", "loss": loss, "mesh": cfg.mesh,
           "micro_batches": rl_cfg.micro_batches, "remat": cfg.model.remat.value,
           "sequence_parallel": rl_cfg.sequence_parallel,
           "attention_impl": cfg.model.attention_impl.value,
           "moe_backend": cfg.model.moe_backend.value}
    if from_dump:
        # No "fits": whether libtpu's own HBM check passed is the finished compile's to say.
        out.update(dump_report(from_dump, cfg.model, rows, seq, chips, tgt.hbm_bytes))
        return out
    try:
        compiled, compile_s, spaces = compile_train_step(cfg.model, rl_cfg, cfg.mesh,
                                                         devices, rows, seq, dump_dir)
    except Exception as e:  # XLA refuses a program over HBM: that is the answer, reported
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        out.update({"fits": False, "rows": rows, "seq": seq,
                    "error": str(e).splitlines()[0][:400]})
        return out
    if dump_hlo:
        with open(dump_hlo, "w") as f:
            f.write(compiled.as_text())
    out["fits"] = True
    out.update(report(compiled, cfg.model, rows, seq, chips, compile_s, spaces, tgt.hbm_bytes))
    return out


def _define_flags():
    """The command line's flags, defined only when this file runs as a program: tests import
    `run` from here, and flags defined at import would collide with other tools' `--config`."""
    config_flags.DEFINE_config_file("config", None, "Experiment config file.")
    flags.DEFINE_string("topology", "v5p-8", "TPU slice: v5p-N (N TensorCores) or "
                        "v5p:AxBxC (chips per dimension); or a GPU: h200.")
    flags.DEFINE_enum("step", "train", ["train", "decode"], "Which jitted step to compile: "
                      "the update step, or one host's decode dispatch.")
    flags.DEFINE_integer("rows", None, "train: packed sequences in the batch (default: "
                         "rl.micro_batches x data-parallel chips); decode: rows of the "
                         "dispatch (default: every slot).")
    flags.DEFINE_integer("slots", None, "decode: engine slots (default: engine.slots).")
    flags.DEFINE_integer("kv_tokens", None, "decode: positions the KV page pool holds "
                         "(default: the config's engine.kv_pages x 16).")
    flags.DEFINE_integer("seq", None, "Sequence length (default: rollout.seq_len).")
    flags.DEFINE_enum("loss", "cispo", ["cispo", "sft"], "Which update step (RL or SFT).")
    flags.DEFINE_string("mesh", None, "Replace the config's mesh, e.g. 'fsdp=4,expert=2'.")
    flags.DEFINE_string("dump_hlo", None, "Write the compiled HLO text to this file.")
    flags.DEFINE_string("dump_dir", None, "train: keep the compile's XLA dump (memory-usage "
                        "report, optimized HLO) in this empty directory.")
    flags.DEFINE_string("from_dump", None, "train: report from a dump kept by --dump_dir "
                        "(same config and flags) instead of compiling.")
    flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    f = flags.FLAGS
    try:
        if f.step == "decode":
            out = run_decode(f.config, f.topology, f.slots, f.rows, f.kv_tokens,
                             dump_hlo=f.dump_hlo)
        else:
            out = run(f.config, f.topology, f.rows, f.seq, f.loss, f.mesh, f.dump_hlo,
                      dump_dir=f.dump_dir, from_dump=f.from_dump)
    except (AotError, ValueError) as e:
        sys.exit(f"experiments.scale.aot: {e}")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
