"""The engine's decode backend: one choice of how the params are laid out for decode.

    Engine(cfg, params, ..., backend=DecodeBackend.AUTO)   # the default

    AS_TRAINED     the params read in place, as the model describes them (stacked runs,
                   weights [in, out]); any platform, any mesh
    CPU_UNSTACKED  one block per layer, sliced once per `set_params`
    CPU_OUT_IN     CPU_UNSTACKED, and every projection (and the grouped routed experts) held
                   output-first (`cpu_out_in.OutIn`) for XLA's products
    CPU_PACKED     CPU_UNSTACKED, and every projection, the LM head (a tied one as a copy beside
                   the embedding) and the grouped routed experts packed for the C++ kernel
                   (`cpu_gemm.Packed`); float32 or bfloat16 params (a bf16 weight streams
                   half the bytes and is widened in the kernel; other float types keep
                   CPU_OUT_IN's layout)
    AUTO           the platform's: on one CPU device (no mesh, or the trainer's one-device
                   local mesh: the laptop case) CPU_PACKED where the kernel builds, else
                   CPU_OUT_IN; AS_TRAINED on every other platform and mesh

Why, each measured on the 13.6M Nemotron-H that `vs_torch` builds (docs/results_history.md): XLA:CPU
copies a scanned run's per-layer weight slice out of the stacked params before every matmul, i.e.
the whole stack once per decoded token (38% of decode op time at batch 1), so the CPU layouts slice
the params into one block per layer once and run the engine's programs on
`cfg.replace(scan_layers=False)` (training keeps the layer scan). XLA:CPU streams a weight ~1.8x
faster for a product with few token rows held output-first (decode 1.22x / 1.18x tokens per CPU
second at batch 8 / 32, tokens identical); the kernel streams each weight in one pass (~2.3x XLA's
rate for an 8-row product), so decode and prefill run their products on it.

Every layout computes the same function as AS_TRAINED: the model's layers call a weight's own
product when it is a `model.dense.BackendWeight` (tests/backends/ against the [in, out]
reference, tests/inference/test_engine.py through the engine).
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from avalon.backends import cpu_gemm
from avalon.backends.cpu_gemm import Packed
from avalon.backends.cpu_out_in import OutIn
from avalon.backends.platform import resolve_moe_backend
from avalon.model.config import LETTERS, ModelConfig, MoeBackend
from avalon.model.params import layer_key


class DecodeBackend(enum.Enum):
    """How the engine lays the params out for decode (see the module doc)."""

    AUTO = "auto"
    AS_TRAINED = "as_trained"
    CPU_UNSTACKED = "cpu_unstacked"
    CPU_OUT_IN = "cpu_out_in"
    CPU_PACKED = "cpu_packed"

    @property
    def unstacks(self) -> bool:
        """One block per layer (the params sliced once)."""
        return self in (DecodeBackend.CPU_UNSTACKED, DecodeBackend.CPU_OUT_IN,
                        DecodeBackend.CPU_PACKED)

    @property
    def relayouts(self) -> bool:
        """Projection weights held in a `BackendWeight` layout (one device only)."""
        return self in (DecodeBackend.CPU_OUT_IN, DecodeBackend.CPU_PACKED)


def select(choice: DecodeBackend | str | None, mesh: Mesh | None = None) -> DecodeBackend:
    """The concrete decode backend for `choice` (None: AUTO) on `mesh` (None: one device).
    Raises a ValueError naming the choice where it cannot run."""
    names = [b.value for b in DecodeBackend]
    if choice is None:
        choice = DecodeBackend.AUTO
    if isinstance(choice, str) and choice in names:
        choice = DecodeBackend(choice)
    if not isinstance(choice, DecodeBackend):
        raise ValueError(f"Engine: backend={choice!r} must be one of {names} (or None: auto)")
    one_device = mesh is None or mesh.size == 1
    one_cpu = one_device and jax.default_backend() == "cpu"
    if choice == DecodeBackend.AUTO:
        if not one_cpu:
            return DecodeBackend.AS_TRAINED
        return DecodeBackend.CPU_PACKED if cpu_gemm.ready() else DecodeBackend.CPU_OUT_IN
    if choice.relayouts and not one_device:
        raise ValueError(f"Engine: backend={choice.value!r} lays weights out for one device; "
                         f"under a mesh of {mesh.size} devices use 'as_trained' or 'auto'")
    if choice.relayouts and jax.default_backend() != "cpu":
        raise ValueError(f"Engine: backend={choice.value!r} is a CPU layout; this platform is "
                         f"{jax.default_backend()} (use 'as_trained' or 'auto')")
    if choice == DecodeBackend.CPU_PACKED and not cpu_gemm.ready():
        raise ValueError("Engine: backend='cpu_packed' needs the CPU product kernel, which did "
                         "not build here (cpu_gemm.ready() is False); use 'cpu_out_in' or "
                         "'auto'")
    return choice


def run_config(backend: DecodeBackend, cfg: ModelConfig) -> ModelConfig:
    """The model config the engine's programs run with this backend's params."""
    return cfg.replace(scan_layers=False) if backend.unstacks and cfg.scan_layers else cfg


def decode_params(backend: DecodeBackend, cfg: ModelConfig, params: dict) -> dict:
    """`params` of `cfg` in `backend`'s layout (concrete, from `select`): the only copies the
    engine makes of a set of params (`Engine.set_params`)."""
    run = _unstack(cfg, params) if backend.unstacks and cfg.scan_layers else params
    if not backend.relayouts:
        return run
    # The kernel takes float32 and bfloat16 (weights and activations); params of other float
    # types keep the output-first layout.
    packed = backend == DecodeBackend.CPU_PACKED and cfg.dtype in cpu_gemm.STORED_DTYPES and all(
        a.dtype.name in cpu_gemm.STORED_DTYPES for a in jax.tree.leaves(run)
        if jnp.issubdtype(a.dtype, jnp.floating))
    return _out_in(run_config(backend, cfg), run, packed)


def unstack_params(cfg: ModelConfig, params: dict) -> dict:
    """`params` of `cfg` (stacked runs) in the layout of `cfg.replace(scan_layers=False)`: one
    block per layer, each leaf [1, ...]. The CPU layouts decode from it: XLA:CPU copies a
    scanned layer's weight slice out of the stack before every matmul (a copy of the whole
    stack per token); one slice per layer here, made once."""
    if not cfg.scan_layers:
        return params
    blocks = []
    for bp, (unit, reps) in zip(params["blocks"], cfg.blocks):
        for r in range(reps):
            for j, ch in enumerate(unit):
                blocks.append({layer_key(0, ch): jax.tree.map(lambda a, r=r: a[r:r + 1],
                                                              bp[layer_key(j, ch)])})
    return {**params, "blocks": blocks}


# The projections `model.dense.dense` computes, per layer kind: param key -> input axes.
PROJECTIONS = {
    "mamba": {"in_z": 1, "in_x": 1, "in_B": 1, "in_C": 1, "in_dt": 1, "out": 2},
    "attention": {"q": 1, "k": 1, "v": 1, "o": 2},
    "mlp": {"up": 1, "down": 1, "gate": 1},
    "moe": {"shared_up": 1, "shared_down": 1, "shared_gate": 1, "latent_in": 1,
            "latent_out": 1, "experts_up": 1, "experts_down": 1, "experts_gate_up": 1},
}
# Leading axes in front of a projection's input axes in its leaf: the layer stack, and for the
# routed experts the expert axis too.
_LEAD = {"experts_up": 2, "experts_down": 2, "experts_gate_up": 2}


def fuse_gate_up(layer: dict) -> dict:
    """A SWIGLU MoE layer's `experts_gate` and `experts_up` as one `experts_gate_up` [.., w,
    2f] (gate columns first), the weight the dispatch runs (`moe.fused_up`): made once here
    for the engine's layouts instead of concatenated at every decode step."""
    if "experts_gate" not in layer:
        return layer
    out = {n: a for n, a in layer.items() if n not in ("experts_gate", "experts_up")}
    out["experts_gate_up"] = jnp.concatenate([layer["experts_gate"], layer["experts_up"]], -1)
    return out


def out_in_params(cfg: ModelConfig, params: dict, packed: bool = False) -> dict:
    """`params` with every projection weight (PROJECTIONS, and the untied LM head) held as a
    `cpu_out_in.OutIn`, output axes first, or, with `packed`, as a `cpu_gemm.Packed` for the
    CPU kernel (float32 or bfloat16; a tied head is then packed too, as `lm_head`). One copy per
    weight; everything else is the same arrays. `cfg` describes the params' blocks (the
    engine's run config, unstacked or not). The routed experts only when `cfg` runs them
    grouped on CPU (the one dispatch with an output-first loop and a packed path)."""
    layout = Packed if packed else OutIn
    experts = resolve_moe_backend(cfg.moe_backend, "cpu") == MoeBackend.GROUPED
    blocks = []
    for bp, (unit, _) in zip(params["blocks"], cfg.blocks):
        block = {}
        for j, ch in enumerate(unit):
            key, table = layer_key(j, ch), PROJECTIONS.get(LETTERS[ch], {})
            layer = fuse_gate_up(bp[key]) if experts else bp[key]
            block[key] = {n: layout.of(a, table[n], _LEAD.get(n, 1))
                          if n in table and (experts or n not in _LEAD) else a
                          for n, a in layer.items()}
        blocks.append(block)
    out = {**params, "blocks": blocks}
    if "lm_head" in params:
        out["lm_head"] = layout.of(params["lm_head"], 1)
    elif packed and cfg.tie_word_embeddings:
        # The tied head packed apart from the embedding (which the token lookup reads as it is): the
        # largest single weight of a small model (SmolLM2: 113 MB of 538), streamed at the kernel's
        # rate instead of XLA's (RESULTS.md, "SmolLM2's decode on CPU"). The model's head reads
        # `lm_head` where the params hold one.
        out["lm_head"] = layout.of(params["embed"].T, 1)
    return out


_unstack = jax.jit(unstack_params, static_argnums=0)
_out_in = jax.jit(out_in_params, static_argnums=(0, 2))
