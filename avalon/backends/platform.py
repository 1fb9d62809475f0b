"""The model's `Ops` per platform: which of the backends' functions a caller that knows its
platform (the engine, the update step, a judge) hands the model, and what the MoE's AUTO means.

    CPU  products of flattened tokens and the LM head's gradient on a transposed copy
         (`cpu_products`), the embedding gathered and a bf16 KV pool stored as bit patterns
         (`cpu_bits`), KV written one token window at a time, MoE dispatch GROUPED
    TPU  MoE dispatch MEGABLOX, on the Pallas kernel (`tpu_megablox`)
    GPU  MoE dispatch CAPACITY_BUCKETS
Everything else is the model's own JAX. The update step adds the CPU's fused kernels on one
device (`training.TrainingPlatform`).
"""

from __future__ import annotations

import jax.numpy as jnp

from avalon.backends import cpu_bits, cpu_products, tpu_megablox
from avalon.model.config import ModelConfig, MoeBackend
from avalon.model.ops import Ops

# What MoeBackend.AUTO means per platform. CPU: GROUPED at any load: in the update step (0.71x ->
# 0.81x transformers against capacity buckets) and, since its loop runs only the occupied tiles
# against each expert's weights in place, in decode too (the 13.6M Nemotron-H of `vs_torch`,
# `Engine.generate`, alternating, one core: 1.44x / 1.32x / 1.11x capacity buckets' tokens/s at
# batch 1 / 8 / 32, tokens identical). GPU: performance.md.
MOE_DEFAULT = {"tpu": MoeBackend.MEGABLOX, "gpu": MoeBackend.CAPACITY_BUCKETS,
               "cuda": MoeBackend.CAPACITY_BUCKETS, "rocm": MoeBackend.CAPACITY_BUCKETS,
               "cpu": MoeBackend.GROUPED}
_SLOW = {("gpu", MoeBackend.RAGGED_DOT): "lax.ragged_dot densifies on GPU (6 TFLOP/s against "
         "509 for a batched matmul on an H200); use capacity_buckets",
         ("cuda", MoeBackend.RAGGED_DOT): "lax.ragged_dot densifies on GPU; use capacity_buckets"}


def resolve_moe_backend(backend: MoeBackend, platform: str) -> MoeBackend:
    """The concrete MoE dispatch for `platform` ('cpu', 'gpu', 'tpu'): AUTO the platform's
    default; a known-slow or impossible pair is refused."""
    if platform not in MOE_DEFAULT:
        raise ValueError(f"ModelConfig.moe_backend: unknown platform {platform!r}")
    if backend == MoeBackend.AUTO:
        return MOE_DEFAULT[platform]
    if (platform, backend) in _SLOW:
        raise ValueError(f"ModelConfig.moe_backend={backend.value!r} on {platform}: "
                         f"{_SLOW[(platform, backend)]}")
    if backend == MoeBackend.MEGABLOX and platform != "tpu":
        raise ValueError(f"ModelConfig.moe_backend='megablox' on {platform}: it is a TPU "
                         "(Mosaic) kernel; use auto")
    return backend


def model_ops(platform: str, cfg: ModelConfig) -> Ops:
    """The ops `cfg`'s model runs with on `platform`, whatever the mesh (the model keeps its
    einsums under a multi-device mesh itself)."""
    moe = resolve_moe_backend(cfg.moe_backend, platform)
    if platform == "cpu":
        return Ops(product=cpu_products.product, head_product=cpu_products.head_product,
                   take_rows=cpu_bits.take_rows, kv_window_writes=True, moe_backend=moe)
    if platform == "tpu":
        return Ops(moe_backend=moe, grouped_matmul=tpu_megablox.megablox_gmm)
    return Ops(moe_backend=moe)


def kv_storage_dtype(dtype, platform: str) -> jnp.dtype:
    """The dtype a KV page pool of `dtype` values is stored as on `platform`
    (`model.attention.init_paged_kv(stored=)`)."""
    return cpu_bits.storage_dtype(dtype, platform)
