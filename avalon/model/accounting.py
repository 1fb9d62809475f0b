"""FLOP, parameter and byte accounting, by the rules of `shared/reference/performance.md`.

Model FLOPs are the matmul FLOPs (2 per multiply-add) of the model as specified: no remat, no
padding, active experts only; training = 3 x forward. The SSD core is counted in its recurrent
form, 4 H P N per token (the chunked kernel executes more). Everything derives from the config
and `jax.eval_shape`-style param shapes; nothing is allocated.

Decode bytes per step (B slots at context T): weights touched (every non-expert weight except the
embedding table, B embedding rows, and per MoE layer the E (1 - (1 - k/E)^B) distinct experts B
tokens are expected to touch) + KV read + SSM state read and write + conv state read and write +
the fp32 logits written. With tied embeddings the LM head reads the whole table every step,
so it counts as a weight read. SwiGLU feed-forwards (`Activation.SWIGLU`) have three matrices
(gate, up, down) where Nemotron's squared-ReLU ones have two.
"""

from __future__ import annotations

import numpy as np

from avalon.model.config import Activation, ModelConfig
from avalon.model.params import abstract_params, count_params

# One H200 (performance.md): datasheet and measured ceilings.
H200_PEAK_FLOPS = 989e12
H200_MEASURED_FLOPS = 801e12
H200_HBM_BYTES_PER_S = 4.24e12


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize if dtype != "bfloat16" else 2


def _matrices(cfg: ModelConfig) -> int:
    """Weight matrices of one feed-forward (MLP, expert, shared expert)."""
    return 3 if cfg.mlp_activation == Activation.SWIGLU else 2


def _expert_param_count(cfg: ModelConfig) -> int:
    """Routed expert weights of one MoE layer."""
    return cfg.n_routed_experts * _matrices(cfg) * cfg.expert_width * cfg.moe_intermediate_size


def param_counts(cfg: ModelConfig) -> dict:
    """Total and active (per token) parameter counts, with and without the MTP block."""
    shapes = abstract_params(cfg)
    mtp = count_params(shapes["mtp"]) if "mtp" in shapes else 0
    total = count_params(shapes) - mtp
    n_moe = cfg.count("E")
    routed = n_moe * _expert_param_count(cfg)
    active_routed = n_moe * cfg.num_experts_per_tok * _matrices(cfg) * cfg.expert_width * \
        cfg.moe_intermediate_size
    embedding = cfg.vocab_size * cfg.hidden_size
    # "Active" follows NVIDIA's convention (Nano: 3.2B active, 3.6B with embeddings): the
    # embedding table is a lookup, not a matmul, so it is excluded; the LM head is included.
    active_with_embedding = total - routed + active_routed
    return {
        "total": total,
        "total_with_mtp": total + mtp,
        "mtp": mtp,
        "active": active_with_embedding - (0 if cfg.tie_word_embeddings else embedding),
        "active_with_embedding": active_with_embedding,
        "embedding": embedding,
        "routed_experts": routed,
    }


def _layer_forward_flops(cfg: ModelConfig, letter: str, attn_context: float) -> float:
    d = cfg.hidden_size
    if letter == "M":
        h, p, g, n, k = (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups,
                         cfg.ssm_state_size, cfg.conv_kernel)
        d_in = h * p
        return (2 * d * (2 * d_in + 2 * g * n + h) + 2 * k * (d_in + 2 * g * n)
                + 2 * d_in * d + 4 * h * p * n)
    if letter == "*":
        nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        return 2 * d * hd * (2 * nq + 2 * nkv) + 4 * nq * hd * attn_context
    if letter == "E":
        w = cfg.expert_width
        m = _matrices(cfg)
        f = (2 * d * cfg.n_routed_experts
             + cfg.num_experts_per_tok * 2 * w * cfg.moe_intermediate_size * m
             + 2 * d * cfg.moe_shared_expert_intermediate_size * m)
        if cfg.moe_latent_size is not None:
            f += 2 * 2 * d * cfg.moe_latent_size
        return f
    return 2 * d * cfg.intermediate_size * _matrices(cfg)  # "-"


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward matmul FLOPs per token of a length-`seq_len` causal sequence (attention core
    averaged over positions: 2 n_q d_h S)."""
    per_layer = sum(_layer_forward_flops(cfg, ch, seq_len / 2) for ch in cfg.pattern)
    return float(per_layer + 2 * cfg.hidden_size * cfg.vocab_size)


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, seq_len)


def decode_step_flops(cfg: ModelConfig, batch: int, context: int) -> float:
    """FLOPs of one decode step of `batch` slots, each at position `context`."""
    per_layer = sum(_layer_forward_flops(cfg, ch, context) for ch in cfg.pattern)
    return float(batch * (per_layer + 2 * cfg.hidden_size * cfg.vocab_size))


def decode_step_bytes(cfg: ModelConfig, batch: int, context: int) -> dict:
    """HBM bytes of one decode step (see the module docstring for what is counted)."""
    wbytes = _itemsize(cfg.param_dtype)
    abytes = _itemsize(cfg.dtype)
    sbytes = _itemsize(cfg.ssm_state_dtype)
    counts = param_counts(cfg)
    n_moe = cfg.count("E")
    dense = counts["total"] - counts["routed_experts"] - counts["embedding"]
    expert = _matrices(cfg) * cfg.expert_width * cfg.moe_intermediate_size
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    touched = e * (1.0 - (1.0 - k / e) ** batch) if n_moe else 0.0
    head = counts["embedding"] if cfg.tie_word_embeddings else 0  # the tied head reads it all
    weights = (dense + head + batch * cfg.hidden_size + n_moe * touched * expert) * wbytes
    n_attn, n_mamba = cfg.count("*"), cfg.count("M")
    kv = batch * context * n_attn * 2 * cfg.num_key_value_heads * cfg.head_dim * abytes
    ssm = 2 * batch * n_mamba * cfg.mamba_inner * cfg.ssm_state_size * sbytes
    conv = 2 * batch * n_mamba * (cfg.conv_kernel - 1) * cfg.conv_dim * abytes
    logits = batch * cfg.vocab_size * 4
    out = {"weights": weights, "kv": kv, "ssm": ssm, "conv": conv, "logits": logits}
    out = {key: float(v) for key, v in out.items()}
    out["total"] = float(sum(out.values()))
    return out


def decode_roofline_s(cfg: ModelConfig, batch: int, context: int,
                      bandwidth: float = H200_HBM_BYTES_PER_S,
                      flops: float = H200_MEASURED_FLOPS) -> float:
    """Lower bound on one decode step: max(bytes / bandwidth, FLOPs / peak)."""
    return max(decode_step_bytes(cfg, batch, context)["total"] / bandwidth,
               decode_step_flops(cfg, batch, context) / flops)
