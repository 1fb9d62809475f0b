"""Meshes and the logical-axis rules table.

Model code names *logical* axes only (`"embed"`, `"q_heads"`, `"batch"`, ...; the legend is in
`avalon/model/params.py`, whose `param_shardings` applies a table here to the params). This
module knows nothing of what the arrays mean. One rules table maps them to the four mesh axes:

  data    pure data parallelism (replicated weights)
  fsdp    data parallelism with weights sharded along their `embed` dimension (ZeRO-3)
  expert  routed experts split across devices
  tensor  heads, MLP width and vocabulary split across devices

There are two tables: `TRAIN_RULES` (FSDP-sharded weights; the batch over data, fsdp and
expert) and `DECODE_RULES` (weights replicated over data/fsdp so each decode step reads only
local weights; slots over data/fsdp).
Switching the one copy of the weights between them is a re-layout, measured by the driver.

A mesh axis that does not divide an array dimension is dropped for that array (e.g. 2 KV heads
on a tensor axis of 4 stay replicated) rather than failing; `check_rules` rejects a table that
maps two logical axes of one array onto the same mesh axis.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")

Rules = Mapping[str, str | tuple[str, ...] | None]

_WEIGHT_RULES = {
    "layers": None,
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mamba_heads": "tensor",
    "mamba_head_dim": None,
    "groups": None,
    "state": None,
    "conv": None,
    "experts": "expert",
    "expert_mlp": "tensor",
    "mlp": "tensor",
    "latent": None,
    "router_experts": None,
}

_ACTIVATION_RULES = {
    "batch": ("data", "fsdp"),
    "act_seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mamba_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    "act_experts": "expert",
    # Inside the sequence mixers (Mamba, attention) of a training forward: the positions, kept
    # whole on every chip (the scan and the causal scores need the full row), and the mixer's
    # channels just before its output projection.
    "mixer_seq": None,
    "act_mixer_out": "tensor",
    "act_mamba_groups": None,
    "cache_seq": None,
    "slots": ("data", "fsdp"),  # the engine's stored per-slot state
    "kv_pages": ("data", "fsdp"),  # the engine's KV pool pages
}

# Training: the batch is split over every data-parallel axis *and* `expert`: the dense layers
# (Mamba, attention, MLP, shared experts) then run on each chip's own tokens, and the routed
# experts are reached by all-to-all over `expert` (avalon/model/moe_ep.py), so no work is
# repeated across the expert axis.
TRAIN_RULES: Rules = {
    **_WEIGHT_RULES, **_ACTIVATION_RULES,
    "batch": ("data", "fsdp", "expert"),
    "embed": "fsdp", "expert_in": "fsdp", "mtp_in": None,
}

# Training with sequence parallelism (`RLConfig.sequence_parallel`), Ulysses-style: rows over
# data x fsdp, each row's positions over `expert`. The residual stream, norms, MLPs and MoE
# layers run on a chip's quarter of a row (the routed experts still all-to-all over `expert`
# for their experts); a Mamba or attention layer switches its projections by all-to-all to
# whole rows with a quarter of the heads (Mamba heads and groups, query heads; the 2 KV heads
# stay whole) and back before its output projection. So one 131K-token row costs each of a
# host's 4 chips the activations of 32K tokens.
TRAIN_SEQ_RULES: Rules = {
    **TRAIN_RULES,
    "batch": ("data", "fsdp"),
    "act_seq": "expert",
    "act_heads": ("tensor", "expert"),
    "act_kv_heads": ("tensor", "expert"),
    "act_mamba_heads": ("tensor", "expert"),
    "act_mamba_groups": "expert",
}

# Decode: tensor parallelism over every model axis of a host for the dense layers. The engine
# runs per host, whose chips differ only in expert/tensor (data/fsdp are size 1 there): the
# heads, MLP width and vocabulary of the dense layers (Mamba, attention, shared experts, LM
# head) are split over tensor *and* expert, so a host holds one copy of them, not one per chip
# (13.9 GB per chip for Super when whole); the routed experts stay split over expert. A
# dispatch's rows are then whole on every chip (each computes its heads for every row), and
# per-slot state splits by heads the same way (Mamba state over tensor x expert). The KV pool
# splits by pages over every axis (`kv_pages`: each chip attends over the pages it holds and
# the partial softmaxes are merged, `attention.paged_attention_sharded`): GQA models have too
# few KV heads (Super: 2) to split them over 4 chips. RESULTS.md, "The pod's decode fits a v5p
# host; rollouts in waves; the mesh builder".
_DECODE_TP = ("tensor", "expert")
DECODE_RULES: Rules = {
    **_WEIGHT_RULES, **_ACTIVATION_RULES,
    "embed": None, "expert_in": None, "mtp_in": None,
    "q_heads": _DECODE_TP, "mamba_heads": _DECODE_TP, "mlp": _DECODE_TP, "vocab": _DECODE_TP,
    "act_heads": _DECODE_TP, "act_mamba_heads": _DECODE_TP, "act_mlp": _DECODE_TP,
    "act_vocab": _DECODE_TP,
    "batch": ("data", "fsdp"),
    "slots": ("data", "fsdp"),
    "kv_pages": ("data", "fsdp", "expert", "tensor"),
}


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence | None = None) -> Mesh:
    """A mesh over all four axes; unnamed axes get size 1. `shape` example: {"data": 2,
    "tensor": 4}. The product must equal the number of devices used."""
    shape = dict(shape or {})
    for name in shape:
        if name not in MESH_AXES:
            raise ValueError(f"mesh axis {name!r} is unknown; the axes are {MESH_AXES}")
    devices = list(devices if devices is not None else jax.devices())
    sizes = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
    if any(s < 1 for s in sizes):
        raise ValueError(f"mesh shape {shape} has a size below 1")
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh shape {shape} needs {int(np.prod(sizes))} devices, "
                         f"{len(devices)} are available")
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    mesh = jax.make_mesh(sizes, MESH_AXES, axis_types=axis_types, devices=devices)
    if _model_axes_cross_processes(mesh.devices):
        mesh = Mesh(_host_major(devices, sizes), MESH_AXES, axis_types=axis_types)
    return mesh


def _model_axes_cross_processes(devices: np.ndarray) -> bool:
    """Whether some (data, fsdp) position's expert x tensor devices span several processes."""
    proc = np.vectorize(lambda d: d.process_index)(devices)
    rows = proc.reshape(-1, proc.shape[2] * proc.shape[3])
    return bool(np.any(rows != rows[:, :1]))


def _host_major(devices: Sequence, sizes: tuple[int, ...]) -> np.ndarray:
    """The devices as a [data, fsdp, expert, tensor] array whose model axes (expert x tensor,
    the fastest-varying) lie within one process: processes in index order, each process's
    devices in their physical order. The engine runs per host on its expert x tensor devices
    (`train.setup.make_local_mesh`); `jax.make_mesh` optimises ICI rings over the whole slice
    and on a v5p-256 laid the expert axis (4 chips along x) over two hosts' 2x2 blocks."""
    model = sizes[2] * sizes[3]
    per: dict[int, list] = {}
    for d in devices:
        per.setdefault(d.process_index, []).append(d)
    counts = {len(v) for v in per.values()}
    if len(counts) != 1 or counts.pop() % model:
        raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: expert x tensor = {model} "
                         "must divide every process's device count (the engine runs per host)")
    key = lambda d: (tuple(getattr(d, "coords", ())), getattr(d, "core_on_chip", 0), d.id)
    order = [d for p in sorted(per) for d in sorted(per[p], key=key)]
    return np.array(order, dtype=object).reshape(sizes)


def _mesh_axes_of(rule) -> tuple[str, ...]:
    if rule is None:
        return ()
    return (rule,) if isinstance(rule, str) else tuple(rule)


def logical_to_spec(axes: Sequence[str | None], rules: Rules, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec for logical `axes`. With `mesh` and `shape`, mesh axes that would not divide
    the dimension (or have size 1) are dropped."""
    used: set[str] = set()
    out = []
    for i, ax in enumerate(axes):
        if ax is not None and ax not in rules:
            raise KeyError(f"logical axis {ax!r} has no rule in the sharding table")
        mesh_axes = _mesh_axes_of(rules[ax]) if ax is not None else ()
        if mesh is not None:
            mesh_axes = tuple(m for m in mesh_axes if mesh.shape[m] > 1)
            if shape is not None:
                kept, size = [], 1
                for m in mesh_axes:
                    if shape[i] % (size * mesh.shape[m]) == 0:
                        kept.append(m)
                        size *= mesh.shape[m]
                mesh_axes = tuple(kept)
        clash = used.intersection(mesh_axes)
        if clash:
            raise ValueError(f"logical axes {tuple(axes)} map mesh axis {sorted(clash)} twice")
        used.update(mesh_axes)
        out.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    while out and out[-1] is None:
        out.pop()
    return PartitionSpec(*out)


def check_rules(axes_tree, rules: Rules) -> None:
    """Raise if any array's logical axes map two dims onto one mesh axis (shape-independent)."""
    for axes in jax.tree.leaves(axes_tree, is_leaf=lambda x: isinstance(x, tuple)):
        logical_to_spec(axes, rules)


def tree_shardings(axes_tree, shapes_tree, mesh: Mesh, rules: Rules):
    """NamedSharding per leaf from a tree of logical-axes tuples and a matching tree of shapes."""
    def one(axes, shaped):
        return NamedSharding(mesh, logical_to_spec(axes, rules, mesh, shaped.shape))
    return jax.tree.map(one, axes_tree, shapes_tree, is_leaf=lambda x: isinstance(x, tuple))


# ---- activation constraints inside the model -------------------------------------------------
_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "avalon_sharding_rules", default=None)


@contextlib.contextmanager
def use_rules(mesh: Mesh, rules: Rules):
    """While active (at trace time), `constrain` pins activations to the mesh per `rules`."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> tuple[Mesh, Rules] | None:
    """The (mesh, rules) of the enclosing `use_rules`, or None outside one."""
    return _ACTIVE.get()


def platform(mesh: Mesh | None) -> str:
    """The platform `mesh`'s devices are (None: the default backend's)."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def active_mesh() -> Mesh | None:
    """The enclosing `use_rules`' mesh when it spans more than one device, else None (one
    device lays every array out whole, as without a mesh)."""
    got = _ACTIVE.get()
    return got[0] if got is not None and got[0].size > 1 else None


def batch_axes(mesh: Mesh, rules: Rules) -> tuple[str, ...]:
    """The mesh axes (of size > 1) the batch is split over under `rules`."""
    return tuple(a for a in _mesh_axes_of(rules["batch"]) if mesh.shape[a] > 1)


def seq_axes(mesh: Mesh, rules: Rules) -> tuple[str, ...]:
    """The mesh axes (of size > 1) each row's positions are split over under `rules`."""
    return tuple(a for a in _mesh_axes_of(rules["act_seq"]) if mesh.shape[a] > 1)


def seq_shards() -> int:
    """Chips one row's positions are split over under the active rules (1 outside them)."""
    active = _ACTIVE.get()
    if active is None:
        return 1
    mesh, rules = active
    return int(np.prod([mesh.shape[a] for a in seq_axes(mesh, rules)], dtype=np.int64))


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical axes; a no-op outside `use_rules`."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = logical_to_spec(axes, rules, mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
