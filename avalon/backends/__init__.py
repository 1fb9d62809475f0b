"""Platform backends beside the model: each platform's fast paths, which compute the model's
function (`avalon/model/`, written once and platform-neutral) faster on that platform.

The engine and the update step select one; the model never imports this package. A backend's
weight layouts plug into the model through one interface, `model.dense.BackendWeight` (a weight
that reads as its own shape and dtype and computes its own product and routed experts).

- `decode.py`: the engine's one choice, `DecodeBackend` (AUTO, AS_TRAINED, CPU_UNSTACKED,
  CPU_OUT_IN, CPU_PACKED), `select` (the platform's default; refusals naming the choice) and
  `decode_params` (the relayout, once per set of params: `unstack_params`, `out_in_params`).
- `cpu_out_in.py`: `OutIn`, weights held output-first for XLA:CPU's few-row products, and the
  grouped experts' forward in that layout.
- `cpu_gemm.py` + `cpu_gemm.cc`: the C++ product kernel behind XLA's FFI (built at first use),
  `Packed` weights and the packed experts' forward.
- `cpu_attention.py` + `cpu_attention.cc`: causal attention for the update step on CPU, forward
  and backward fused in C++ behind XLA's FFI, registered as the model's AttentionImpl.KERNEL.
- `cpu_log_softmax.py` + `.cc`: the update step's log-probs' row reductions on CPU.
- `cpu_blas.py` + `.cc`: the update step's fp32 products on Intel MKL (the optional `cpu` extra),
  used through `model.dense.platform_product`.
- `cpu_optimizer.py` + `.cc`: the update step's gradient norm, clip and AdamW in one pass per
  parameter on CPU (optax's state).
- `cpu_build.py` (+ `cpu_ffi.h`, `cpu_parallel.h`, `cpu_vector.h`): building, caching and
  registering the C++ kernels.
- `training.py`: what the update step runs with per platform (`compiler_options`,
  `model_config`: the fused attention, `log_softmax`, `products`: MKL's, `fused_optimizer`, on
  a one-device CPU).

What stays in the model: every MoE dispatch the update step differentiates (DENSE, RAGGED_DOT,
CAPACITY_BUCKETS, GROUPED, and MEGABLOX under expert parallelism, `model/moe*.py`), each equal
to the dense reference in tests/model; `ModelConfig.moe_backend=AUTO` resolves per platform when
a layer is traced (`moe.resolve_backend`: TPU megablox, GPU capacity buckets, CPU grouped).
docs/architecture.md says how to add a backend.
"""

from avalon.backends.decode import DecodeBackend, decode_params, run_config, select

__all__ = ["DecodeBackend", "decode_params", "run_config", "select"]
