"""Platform backends beside the model: each platform's fast paths, which compute the model's
function (`avalon/model/`, plain JAX, written once) faster on that platform.

The model never imports this package and never asks which platform it runs on. The backends
reach it through two interfaces: one argument, `model.ops.Ops` (the functions some layers run
with: products, the LM head's product, norms, SwiGLU, attention, the embedding gather, the KV
writes, the MoE dispatch), and `model.dense.BackendWeight` (a weight that reads as its own shape
and dtype and computes its own product and routed experts). A reader on TPU or GPU can skip
everything here named cpu_*.

- `platform.py`: the model's `Ops` per platform (`model_ops`), what MoE's AUTO means
  (`resolve_moe_backend`), how the KV pool is stored (`kv_storage_dtype`).
- `training.py`: `TrainingPlatform`, the update step's choices, built once from the mesh: the
  ops (with the CPU kernels below on one device), the log-probs kernel, the fused optimizer, the
  compiler options, whether logits are kept for the backward.
- `decode.py`: the engine's one choice, `DecodeBackend` (AUTO, AS_TRAINED, CPU_UNSTACKED,
  CPU_OUT_IN, CPU_PACKED), `select` (the platform's default; refusals naming the choice) and
  `decode_params` (the relayout, once per set of params: `unstack_params`, `out_in_params`).
- `cpu_out_in.py`: `OutIn`, weights held output-first for XLA:CPU's few-row products, and the
  grouped experts' forward in that layout.
- `cpu_gemm.py` + `cpu_gemm.cc`: the C++ product kernel behind XLA's FFI (built at first use),
  `Packed` weights and the packed experts' forward.
- `cpu_attention.py` + `cpu_attention.cc`: causal attention for the update step on CPU, forward
  and backward fused in C++ behind XLA's FFI (`Ops.attention`).
- `cpu_log_softmax.py` + `.cc`: the update step's log-probs' row reductions on CPU.
- `cpu_blas.py` + `.cc`: the update step's fp32 products on Intel MKL (the optional `cpu` extra),
  `Ops.product` through `cpu_products.mkl_product`.
- `cpu_products.py`: products of flattened tokens and the LM head's gradient on a transposed
  copy (XLA:CPU's fast forms).
- `cpu_bits.py`: 16-bit floats moved as bit patterns (the embedding gather, the KV pool).
- `cpu_rms_norm.py`, `cpu_swiglu.py` + `.cc`: the update step's RMSNorm and SwiGLU on CPU.
- `tpu_megablox.py`: MEGABLOX's Pallas grouped matmul (`Ops.grouped_matmul`).
- `cpu_optimizer.py` + `.cc`: the update step's gradient norm, clip and AdamW in one pass per
  parameter on CPU (optax's state).
- `cpu_build.py` (+ `cpu_ffi.h`, `cpu_parallel.h`, `cpu_vector.h`): building, caching and
  registering the C++ kernels.

What stays in the model: every MoE dispatch the update step differentiates (DENSE, RAGGED_DOT,
CAPACITY_BUCKETS, GROUPED, and MEGABLOX's dispatch under expert parallelism, `model/moe*.py`),
each equal to the dense reference in tests/model. docs/architecture.md says how to add a backend.
"""

from avalon.backends.decode import DecodeBackend, decode_params, run_config, select

__all__ = ["DecodeBackend", "decode_params", "run_config", "select"]
