"""What the update step runs with on its platform: one `TrainingPlatform`, built once from the
mesh (`TrainingPlatform.for_mesh`) and handed to `rl.update.make_update_step`.

It holds the model's `Ops` (`platform.model_ops`, plus, on a CPU with one device, the update
step's kernels), the log-probs' row reductions, the optimizer's fused pass, the compiler's
options and whether a micro-batch's logits are kept for the backward. A TPU or GPU update step
gets the model's own JAX but for its MoE dispatch, optax, and the compilers' defaults.

On a CPU with one device, FLASH attention is computed by the fused kernel
(`cpu_attention.py`) where it fits and builds (2.6x the model's own at SmolLM2's shapes), and
the log-probs' row reductions by another (`cpu_log_softmax.py`), the optimizer by a third
(`cpu_optimizer.py`), RMSNorm and SwiGLU by two more (`cpu_rms_norm.py`, `cpu_swiglu.py`)
and, with MKL installed, the float32 products by MKL (`cpu_blas.py`): the same functions,
faster; a micro-batch's logits are kept for the backward where they fit `KEEP_LOGITS_BYTES`.
With several devices the model's own stay (XLA would run an opaque kernel replicated on every
device, the whole batch on each).

XLA:CPU compiles the update step's programs with YNNPACK for single dots only: reductions and
elementwise passes run on XLA's own emitters. YNNPACK's reduce fusions (norms, softmax, the SSD's
dt gradient) were the slower ones (without any YNNPACK fusion the vs_torch update step took 12%
less CPU time); its single dots are faster than Eigen's once the LM head's weight gradient is an
untransposed product (`cpu_products.head_product`): 1.05x / 1.08x on the step, medians of 5 / 7
alternating pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax.sharding import Mesh

from avalon import sharding
from avalon.backends import (
    cpu_attention,
    cpu_blas,
    cpu_log_softmax,
    cpu_optimizer,
    cpu_products,
    cpu_rms_norm,
    cpu_swiglu,
)
from avalon.backends.platform import model_ops
from avalon.model.config import AttentionImpl, ModelConfig
from avalon.model.ops import Ops

CPU_COMPILER_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}

# The most fp32 logits (bytes, rows x positions x vocabulary of a micro-batch) a one-device CPU's
# update step keeps for the backward instead of recomputing them per chunk: the backward then
# holds them and their gradient (2x this). Host memory is the plentiful resource there and the
# second LM-head product the scarce one (~0.4 s of SmolLM2's update step, 1,024 positions, on
# one core); an accelerator's HBM is the other way round.
KEEP_LOGITS_BYTES = 512 << 20


@dataclasses.dataclass(frozen=True)
class TrainingPlatform:
    """The update step's platform choices (see the module doc).

    ops               the model's functions (`model.ops.Ops`)
    log_softmax       fn(logits, targets) -> (logp, entropy), `rl.logprobs.log_softmax_stats`'s
                      function, or None (the reference)
    optimizer         a module with `global_norm` and `adamw_update` (norm + clip + AdamW in
                      one pass per parameter, on optax's state), or None (optax's passes)
    compiler_options  the update step's jits' XLA options, or None (the defaults)
    keep_logits_bytes the most fp32 logits of a micro-batch kept for the backward (0: chunked
                      and recomputed)"""

    name: str
    ops: Ops
    log_softmax: Callable | None = None
    optimizer: Any = None
    compiler_options: dict | None = None
    keep_logits_bytes: int = 0

    def keep_logits(self, rows: int, positions: int, vocab: int) -> bool:
        """Whether a micro-batch's logits are made in one product and kept for the backward
        (`rl.logprobs.token_logprobs(keep_logits=)`)."""
        return rows * positions * vocab * 4 <= self.keep_logits_bytes

    @classmethod
    def for_mesh(cls, mesh: Mesh | None, cfg: ModelConfig) -> TrainingPlatform:
        """The platform of `mesh`'s devices (None: the default backend's) for `cfg`'s model
        (the training config: `rl.update.training_model_config`)."""
        name = sharding.platform(mesh)
        ops = model_ops(name, cfg)
        if name != "cpu":
            return cls(name, ops)
        if mesh is not None and mesh.size > 1:
            return cls(name, ops, compiler_options=dict(CPU_COMPILER_OPTIONS))
        return cls(name, _one_cpu_ops(ops, cfg),
                   log_softmax=(cpu_log_softmax.log_softmax_stats if cpu_log_softmax.ready()
                                else None),
                   optimizer=cpu_optimizer if cpu_optimizer.ready() else None,
                   compiler_options=dict(CPU_COMPILER_OPTIONS),
                   keep_logits_bytes=KEEP_LOGITS_BYTES)


def _one_cpu_ops(ops: Ops, cfg: ModelConfig) -> Ops:
    """`ops` with the update step's kernels of a one-device CPU, each where it builds: MKL's
    products, fused FLASH attention (where `cfg`'s shapes fit it), RMSNorm and SwiGLU."""
    fields = {}
    if cpu_blas.ready():
        fields.update(product=cpu_products.mkl_product,
                      head_product=cpu_products.mkl_head_product)
    if (cfg.attention_impl == AttentionImpl.FLASH and cpu_attention.fits(cfg)
            and cpu_attention.ready()):
        fields["attention"] = cpu_attention.attention_core
    if cpu_rms_norm.ready():
        fields["rms_norm"] = cpu_rms_norm.rms_norm
    if cpu_swiglu.ready():
        fields["swiglu"] = cpu_swiglu.swiglu
    return dataclasses.replace(ops, **fields)
