"""The Hugging Face config.json of a GGUF file, from llama.cpp's metadata keys.

A GGUF carries no config.json: its metadata holds the model's shape under llama.cpp's names
(`{arch}.embedding_length`, `{arch}.attention.head_count`, ...), written by llama.cpp's
convert_hf_to_gguf.py from the original config. `hf_config` inverts that for the four
architectures Avalon imports (`llama`, `qwen2`, `qwen3`, `qwen3moe`), producing the dict the
Hub's config.json for the same model holds (`rope_theta`, `rope_scaling`, `num_experts`: the
keys transformers reads in every version, not 5.x's `rope_parameters`).

Where llama.cpp leaves a key out, the value llama.cpp itself runs the model with is used
(`rope.freq_base` absent -> 10000; `head_count_kv` absent -> `head_count`). Float metadata is
float32 in the file; it is written back as the shortest decimal that is the same float32
(`1e-05`, not `9.999999747378752e-06`), which is what the original config.json held.

Llama 3's rope scaling is not in the metadata: the converter stores the per-frequency factors
it implies as the tensor `rope_freqs.weight`. `llama3_scaling` recovers `factor` and
`original_max_position_embeddings` from them, with `low_freq_factor` 1 and `high_freq_factor`
4 (the Llama 3.1-3.3 values and the converter's defaults), and refuses factors those do not
reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

MODEL_TYPES = {"llama": ("llama", "LlamaForCausalLM"),
               "qwen2": ("qwen2", "Qwen2ForCausalLM"),
               "qwen3": ("qwen3", "Qwen3ForCausalLM"),
               "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM")}
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0


class GgufConfigError(ValueError):
    """A GGUF file's metadata does not describe a model Avalon imports; names the key."""


def float32_decimal(x) -> float:
    """The shortest decimal that rounds to the same float32 as `x`."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="0"))


def llama3_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float,
                   high_freq_factor: float, original_context: int) -> np.ndarray:
    """The per-frequency divisors Llama 3's rope scaling applies (one per rotary pair), as
    llama.cpp's converter stores them in `rope_freqs.weight` (float32)."""
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32)
                                         / np.float32(head_dim)))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor, mid))
    return out.astype(np.float32)


def llama3_scaling(factors: np.ndarray, theta: float, head_dim: int, where: str) -> dict | None:
    """Llama 3 `rope_scaling` whose factors are `factors` (see the module docstring); None when
    every factor is 1 (no scaling)."""
    f = np.asarray(factors, np.float64)
    if f.shape != (head_dim // 2,):
        raise GgufConfigError(f"{where}: rope_freqs.weight has shape {list(f.shape)}, expected "
                              f"[{head_dim // 2}] (head_dim / 2)")
    factor = float(f.max())
    if np.allclose(f, 1.0):
        return None
    lo, hi = LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR
    wavelen = 2 * math.pi * np.float64(theta) ** (np.arange(0, head_dim, 2) / head_dim)
    candidates = [8192]
    for i in np.flatnonzero((f > 1 + 1e-6) & (f < factor - 1e-6)):
        # In the smooth band 1/f = (1 - s)/factor + s with s = (orig/wavelen - lo)/(hi - lo).
        s = (1 / f[i] - 1 / factor) / (1 - 1 / factor)
        candidates.insert(0, round(wavelen[i] * (s * (hi - lo) + lo)))
    for orig in candidates:
        if np.allclose(llama3_factors(theta, head_dim, factor, lo, hi, orig), f, rtol=1e-5):
            return {"rope_type": "llama3", "factor": float32_decimal(factor),
                    "low_freq_factor": lo, "high_freq_factor": hi,
                    "original_max_position_embeddings": int(orig)}
    raise GgufConfigError(f"{where}: rope_freqs.weight holds rope factors that Llama 3 scaling "
                          f"with low_freq_factor {lo} and high_freq_factor {hi} does not produce")


def _rope_scaling(get: Callable, arch: str, where: str) -> dict | None:
    kind = get(f"{arch}.rope.scaling.type", None)
    factor = get(f"{arch}.rope.scaling.factor", None)
    if kind is None and (linear := get(f"{arch}.rope.scale_linear", None)) is not None:
        kind, factor = "linear", linear  # the key older converters wrote
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float32_decimal(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float32_decimal(factor),
               "original_max_position_embeddings":
                   int(get(f"{arch}.rope.scaling.original_context_length"))}
        for key, hf in (("yarn_ext_factor", "extrapolation_factor"),
                        ("yarn_attn_factor", "attention_factor"),
                        ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (v := get(f"{arch}.rope.scaling.{key}", None)) is not None:
                out[hf] = float32_decimal(v)
        return out
    raise GgufConfigError(f"{where}: {arch}.rope.scaling.type is {kind!r}; Avalon imports "
                          "none, linear, yarn and Llama 3's (rope_freqs.weight)")


def hf_config(get: Callable, shapes: Mapping[str, tuple[int, ...]], where: str,
              rope_freqs: np.ndarray | None = None) -> dict:
    """config.json for a GGUF file. `get(key[, default])` reads a metadata value (raising
    GgufConfigError naming a missing required key); `shapes` maps GGUF tensor names to torch
    shapes; `rope_freqs` is the dequantised `rope_freqs.weight` when the file has one."""
    arch = get("general.architecture")
    model_type, architecture = MODEL_TYPES[arch]
    hidden = int(get(f"{arch}.embedding_length"))
    heads = int(get(f"{arch}.attention.head_count"))
    kv_heads = int(get(f"{arch}.attention.head_count_kv", heads))
    head_dim = get(f"{arch}.attention.key_length", None)
    if head_dim is None and arch == "llama":
        head_dim = get("llama.rope.dimension_count", None)
    head_dim = int(head_dim) if head_dim is not None else hidden // heads
    layers = int(get(f"{arch}.block_count"))
    vocab = shapes["token_embd.weight"][0]
    if (stated := get(f"{arch}.vocab_size", None)) is not None and int(stated) != vocab:
        raise GgufConfigError(f"{where}: {arch}.vocab_size is {stated} but token_embd.weight has "
                              f"{vocab} rows")
    theta = float32_decimal(get(f"{arch}.rope.freq_base", 10000.0))
    cfg = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": int(get(f"{arch}.context_length")),
        "rms_norm_eps": float32_decimal(get(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
    }
    if (ff := get(f"{arch}.feed_forward_length", None)) is not None:
        cfg["intermediate_size"] = int(ff)
    scaling = _rope_scaling(get, arch, where)
    if rope_freqs is not None:
        if scaling is not None:
            raise GgufConfigError(f"{where}: both {arch}.rope.scaling.type and rope_freqs.weight "
                                  "are set")
        scaling = llama3_scaling(rope_freqs, theta, head_dim, where)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    if arch == "qwen3moe":
        gate = shapes.get("blk.0.ffn_gate_exps.weight")
        cfg.update({
            "num_experts": int(get("qwen3moe.expert_count")),
            "num_experts_per_tok": int(get("qwen3moe.expert_used_count")),
            "moe_intermediate_size": int(get("qwen3moe.expert_feed_forward_length",
                                             gate[1] if gate else None)),
            # llama.cpp's qwen3moe graph always renormalises the top-k weights.
            "norm_topk_prob": bool(get("qwen3moe.expert_weights_norm", True)),
            "decoder_sparse_step": 1, "mlp_only_layers": [],
        })
    if arch in ("qwen2", "qwen3", "qwen3moe"):
        cfg["use_sliding_window"] = False
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        if (v := get(f"tokenizer.ggml.{key}", None)) is not None:
            cfg[hf] = int(v)
    _check_shapes(cfg, shapes, where)
    return cfg


def _check_shapes(cfg: dict, shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The metadata must describe the tensors (a wrong head count would load silently)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    want = {"token_embd.weight": (cfg["vocab_size"], h),
            "blk.0.attn_q.weight": (cfg["num_attention_heads"] * d, h),
            "blk.0.attn_k.weight": (cfg["num_key_value_heads"] * d, h),
            "blk.0.attn_output.weight": (h, cfg["num_attention_heads"] * d)}
    if "intermediate_size" in cfg and "blk.0.ffn_gate.weight" in shapes:
        want["blk.0.ffn_gate.weight"] = (cfg["intermediate_size"], h)
    if "num_experts" in cfg:
        want["blk.0.ffn_gate_exps.weight"] = (cfg["num_experts"], cfg["moe_intermediate_size"], h)
    for name, shape in want.items():
        if name not in shapes:
            raise GgufConfigError(f"{where}: tensor {name} is missing")
        if tuple(shapes[name]) != shape:
            raise GgufConfigError(f"{where}: tensor {name} has shape {list(shapes[name])} but the "
                                  f"metadata implies {list(shape)}")
    last = cfg["num_hidden_layers"] - 1
    if f"blk.{last}.attn_q.weight" not in shapes or f"blk.{last + 1}.attn_q.weight" in shapes:
        raise GgufConfigError(f"{where}: block_count is {last + 1} but the tensors' blocks do "
                              "not match")
