"""What the update step runs with on each platform (`rl/update.py` asks `compiler_options` and
`model_config`).

On a CPU with one device, FLASH attention is computed by the fused kernel
(`cpu_attention.py`) where it fits and builds (2.6x the model's own at SmolLM2's shapes), and
the log-probs' row reductions by another (`cpu_log_softmax.py`), the optimizer by a third
(`cpu_optimizer.py`), RMSNorm and SwiGLU by two more (`cpu_rms_norm.py`, `cpu_swiglu.py`)
and, with MKL installed, the products by MKL (`cpu_blas.py`): the same
functions, faster (experiments/bench/RESULTS.md, "SmolLM2's update step against transformers
on one core"); a micro-batch's logits are kept for the
backward where they fit `KEEP_LOGITS_BYTES` (`keep_logits`). With several devices the model's
own stay (XLA would run an opaque kernel replicated on every device, the whole batch on each).

XLA:CPU compiles the update step's programs with YNNPACK for single dots only: reductions and
elementwise passes run on XLA's own emitters. YNNPACK's reduce fusions (norms, softmax, the SSD's dt
gradient) were the slower ones here (without any YNNPACK fusion the vs_torch update step took 12%
less CPU time; docs/results_history.md, the update step against transformers); its single dots are
faster than Eigen's once the LM head's weight gradient is an untransposed product
(`model.dense.dense_head`): 1.05x / 1.08x on the step, medians of 5 / 7 alternating pairs
(docs/results_history.md, "Prefill without 2x padding, the LM head's gradient, YNNPACK dots in the
update"). Other platforms compile with their defaults.
"""

from __future__ import annotations

import contextlib

from jax.sharding import Mesh

from avalon import sharding
from avalon.backends import (
    cpu_attention,
    cpu_blas,
    cpu_log_softmax,
    cpu_optimizer,
    cpu_rms_norm,
    cpu_swiglu,
)
from avalon.model import dense, kernels
from avalon.model.config import ModelConfig

CPU_COMPILER_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(mesh: Mesh | None) -> dict | None:
    """The XLA options the update step's jits compile with on this mesh's platform (no mesh:
    the default backend's)."""
    return dict(CPU_COMPILER_OPTIONS) if sharding.platform(mesh) == "cpu" else None


def _one_cpu(mesh: Mesh | None) -> bool:
    return sharding.platform(mesh) == "cpu" and (mesh is None or mesh.size == 1)


def model_config(cfg: ModelConfig, mesh: Mesh | None) -> ModelConfig:
    """The model config the update step traces on this mesh's platform: on a one-device CPU,
    FLASH attention on the fused kernel (`cpu_attention.select`); elsewhere cfg itself."""
    return cpu_attention.select(cfg) if _one_cpu(mesh) else cfg


def log_softmax(mesh: Mesh | None):
    """The update step's log-prob kernel on this mesh (`rl.logprobs.token_logprobs(stats=)`):
    on a one-device CPU where it builds, `cpu_log_softmax.log_softmax_stats`; else None (XLA)."""
    if _one_cpu(mesh) and cpu_log_softmax.ready():
        return cpu_log_softmax.log_softmax_stats
    return None


# The most fp32 logits (bytes, rows x positions x vocabulary of a micro-batch) a one-device CPU's
# update step keeps for the backward instead of recomputing them per chunk: the backward then
# holds them and their gradient (2x this). Host memory is the plentiful resource there and the
# second LM-head product the scarce one (~0.4 s of SmolLM2's update step, 1,024 positions, on
# one core); an accelerator's HBM is the other way round.
KEEP_LOGITS_BYTES = 512 << 20


def keep_logits(mesh: Mesh | None, rows: int, positions: int, vocab: int) -> bool:
    """Whether the update step makes a micro-batch's logits in one product and keeps them for
    the backward (`rl.logprobs.token_logprobs(keep_logits=)`): on a one-device CPU, where they
    take at most KEEP_LOGITS_BYTES; else they are chunked and recomputed."""
    return _one_cpu(mesh) and rows * positions * vocab * 4 <= KEEP_LOGITS_BYTES


def products(mesh: Mesh | None):
    """A context for tracing the update step's model: on a one-device CPU with MKL installed
    (`cpu_blas.ready`), the float32 products of `model.dense` on MKL; else nothing changes."""
    if _one_cpu(mesh) and cpu_blas.ready():
        return dense.platform_product(cpu_blas.product)
    return contextlib.nullcontext()


def layer_kernels(mesh: Mesh | None):
    """A context for tracing the update step's model: on a one-device CPU, RMSNorm and the
    SwiGLU activation on their kernels (`cpu_rms_norm`, `cpu_swiglu`) where they build; else
    nothing changes."""
    if not _one_cpu(mesh):
        return contextlib.nullcontext()
    fns = {}
    if cpu_rms_norm.ready():
        fns["rms_norm"] = cpu_rms_norm.rms_norm
    if cpu_swiglu.ready():
        fns["swiglu"] = cpu_swiglu.swiglu
    return kernels.use(**fns)


def fused_optimizer(mesh: Mesh | None):
    """The update step's norm + clip + AdamW in one pass per parameter on this mesh: on a
    one-device CPU where it builds, `cpu_optimizer` (`global_norm`, `adamw_update`); else None
    (optax's passes)."""
    return cpu_optimizer if _one_cpu(mesh) and cpu_optimizer.ready() else None
