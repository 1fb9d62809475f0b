"""Hugging Face configs of the Llama/Qwen families <-> avalon `ModelConfig`.

    model_type   transformers class          avalon
    llama        LlamaForCausalLM            "*-" x L, rope, SWIGLU; attention_bias: q/k/v/o
    qwen2        Qwen2ForCausalLM            + q/k/v biases (always), no o bias
    qwen3        Qwen3ForCausalLM            + qk_norm; attention_bias: q/k/v/o
    qwen3_moe    Qwen3MoeForCausalLM         "*E" per sparse layer ("*-" for the layers in
                                             `mlp_only_layers` or off `decoder_sparse_step`),
                                             Router.SOFTMAX, no shared expert

Each HF decoder layer i is avalon layers 2i (attention, norm = `input_layernorm`) and 2i + 1
(MLP or MoE, norm = `post_attention_layernorm`): the same pre-norm residual pair.

RoPE comes from `rope_parameters` (transformers 5) or the older top-level `rope_theta` and
`rope_scaling`; `partial_rotary_factor` sets `rotary_dim`. Scalings other than default, linear
and llama3 (yarn, dynamic, longrope) and sliding-window attention are refused with the key
named, not approximated. Missing keys take transformers 5.24's defaults for the model type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from avalon.model.config import Activation, ModelConfig, RopeScaling, Router

MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}

# transformers 5.24's defaults for the keys read here, per model type.
_COMMON = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
           "initializer_range": 0.02, "attention_bias": False, "mlp_bias": False,
           "head_dim": None, "num_key_value_heads": None, "use_sliding_window": False,
           "partial_rotary_factor": 1.0}
DEFAULTS = {
    "llama": {**_COMMON, "max_position_embeddings": 2048, "intermediate_size": 11008,
              "num_attention_heads": 32, "num_hidden_layers": 32},
    "qwen2": {**_COMMON, "max_position_embeddings": 32768, "intermediate_size": 22016,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32},
    "qwen3": {**_COMMON, "max_position_embeddings": 32768, "intermediate_size": 22016,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
              "head_dim": 128},
    "qwen3_moe": {**_COMMON, "max_position_embeddings": 32768, "intermediate_size": 6144,
                  "num_attention_heads": 32, "num_hidden_layers": 24, "num_key_value_heads": 4,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768,
                  "num_experts_per_tok": 8, "num_experts": 128, "norm_topk_prob": False,
                  "mlp_only_layers": []},
}
DEFAULT_THETA = 10000.0


class FamilyConfigError(ValueError):
    """config.json cannot describe an avalon model; the message names the key and value."""


def typed(h: Mapping, key: str, kind: type, source: str,
          error: type[ValueError] = FamilyConfigError):
    """`h[key]` as `kind` (int, float or bool; an integer is a number, a bool is neither), else
    `error` naming the source, the key and the value (each config reader raises its own)."""
    v = h[key]
    if kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        v = float(v) if ok else v
    else:
        ok = isinstance(v, bool)
    if not ok:
        what = {int: "an integer", float: "a number", bool: "true or false"}[kind]
        raise error(f"{source}: {key!r}={h[key]!r} must be {what}")
    return v


def _rope(h: Mapping, source: str) -> dict:
    """ModelConfig rope fields from `rope_parameters` or `rope_theta` + `rope_scaling`."""
    params = dict(h.get("rope_parameters") or {})
    legacy = h.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or not isinstance(legacy, Mapping):
        raise FamilyConfigError(f"{source}: 'rope_parameters'={params!r} must be an object")
    for k, v in legacy.items():
        params.setdefault(k, v)
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", h.get("rope_theta", DEFAULT_THETA))
    out: dict = {"rope_theta": typed({"rope_theta": theta}, "rope_theta", float, source)}
    factor = params.get("partial_rotary_factor", h.get("partial_rotary_factor", 1.0))
    head_dim = h["head_dim"]
    if factor != 1.0:
        out["rotary_dim"] = int(head_dim * factor)
    try:
        scaling = RopeScaling(kind)
    except ValueError:
        raise FamilyConfigError(
            f"{source}: rope type {kind!r} is not supported (default, linear, llama3)") from None
    out["rope_scaling"] = scaling
    if scaling != RopeScaling.NONE:
        out["rope_factor"] = typed(params, "factor", float, source)
    if scaling == RopeScaling.LLAMA3:
        out["rope_low_freq_factor"] = typed(params, "low_freq_factor", float, source)
        out["rope_high_freq_factor"] = typed(params, "high_freq_factor", float, source)
        original = params.get("original_max_position_embeddings",
                              h.get("original_max_position_embeddings",
                                    h["max_position_embeddings"]))
        out["rope_original_max_position"] = typed(
            {"original_max_position_embeddings": original},
            "original_max_position_embeddings", int, source)
    return out


def _pattern(h: Mapping, model_type: str, source: str) -> str:
    n = typed(h, "num_hidden_layers", int, source)
    if model_type != "qwen3_moe":
        return "*-" * n
    step = typed(h, "decoder_sparse_step", int, source)
    dense = h.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise FamilyConfigError(f"{source}: 'mlp_only_layers'={dense!r} must be a list of ints")
    if step <= 0:
        raise FamilyConfigError(f"{source}: 'decoder_sparse_step'={step} must be positive")
    return "".join("*E" if i not in dense and (i + 1) % step == 0 else "*-" for i in range(n))


def from_hf(d: Mapping, *, source: str = "config.json", checkpoint_dtype: str | None = None,
            **overrides) -> ModelConfig:
    """A `ModelConfig` from a Llama/Qwen config.json dict (model_type in MODEL_TYPES)."""
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise FamilyConfigError(f"{source}: 'model_type'={model_type!r} is not one of "
                                f"{', '.join(MODEL_TYPES)}")
    h = {**DEFAULTS[model_type], **{k: v for k, v in d.items() if v is not None
                                    or k not in DEFAULTS[model_type]}}
    if "num_local_experts" in d and "num_experts" not in d:  # what 5.24 writes for qwen3_moe
        h["num_experts"] = d["num_local_experts"]
    for k in ("vocab_size", "hidden_size"):
        if k not in h:
            raise FamilyConfigError(f"{source}: required key {k!r} is missing")
    if h["hidden_act"] != "silu":
        raise FamilyConfigError(f"{source}: 'hidden_act'={h['hidden_act']!r} is not supported "
                                "(only 'silu', the SwiGLU MLP)")
    if h.get("use_sliding_window"):
        raise FamilyConfigError(f"{source}: 'use_sliding_window'=true is not supported "
                                "(full attention only)")
    heads = typed(h, "num_attention_heads", int, source)
    if h["num_key_value_heads"] is None:
        h["num_key_value_heads"] = heads
    if h["head_dim"] is None:
        h["head_dim"] = typed(h, "hidden_size", int, source) // heads
    bias = typed(h, "attention_bias", bool, source)
    kw: dict = {
        "vocab_size": typed(h, "vocab_size", int, source),
        "hidden_size": typed(h, "hidden_size", int, source),
        "pattern": _pattern(h, model_type, source),
        "num_attention_heads": heads,
        "num_key_value_heads": typed(h, "num_key_value_heads", int, source),
        "head_dim": typed(h, "head_dim", int, source),
        "intermediate_size": typed(h, "intermediate_size", int, source),
        # Unused by these families (no Mamba layer); validated only when `M` is present.
        "mamba_num_heads": 1, "mamba_head_dim": 1, "ssm_state_size": 1, "n_groups": 1,
        "layer_norm_epsilon": typed(h, "rms_norm_eps", float, source),
        "tie_word_embeddings": typed(h, "tie_word_embeddings", bool, source),
        "initializer_range": typed(h, "initializer_range", float, source),
        "max_context": typed(h, "max_position_embeddings", int, source),
        "mlp_activation": Activation.SWIGLU,
        "mlp_bias": typed(h, "mlp_bias", bool, source) if model_type == "llama" else False,
        "attention_qkv_bias": True if model_type == "qwen2" else bias,
        "attention_out_bias": False if model_type == "qwen2" else bias,
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "rescale_prenorm_residual": False,
        **_rope(h, source),
    }
    if model_type == "qwen3_moe":
        kw.update(router=Router.SOFTMAX,
                  n_routed_experts=typed(h, "num_experts", int, source),
                  num_experts_per_tok=typed(h, "num_experts_per_tok", int, source),
                  moe_intermediate_size=typed(h, "moe_intermediate_size", int, source),
                  moe_shared_expert_intermediate_size=0,
                  norm_topk_prob=typed(h, "norm_topk_prob", bool, source))
    kw["param_dtype"] = checkpoint_dtype or "float32"
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for k in overrides:
        if k not in fields:
            raise FamilyConfigError(f"override {k!r} is not a ModelConfig field")
    kw.update(overrides)
    kw.setdefault("dtype", kw["param_dtype"])
    try:
        return ModelConfig(**kw)
    except ValueError as e:
        raise FamilyConfigError(f"{source}: {e}") from None


def family(cfg: ModelConfig) -> str | None:
    """The HF model type that describes `cfg`, or None for a Nemotron-H config (no rotary
    embedding). Raises when `cfg` mixes options no one HF class has."""
    if cfg.rope_theta is None:
        return None
    where = "ModelConfig"
    pairs = [cfg.pattern[i:i + 2] for i in range(0, len(cfg.pattern), 2)]
    if len(cfg.pattern) % 2 or any(p not in ("*-", "*E") for p in pairs):
        raise FamilyConfigError(f"{where}.pattern={cfg.pattern!r}: a Llama/Qwen stack is "
                                "attention then MLP (or MoE) per layer, '*-' or '*E' pairs")
    if cfg.mlp_activation != Activation.SWIGLU:
        raise FamilyConfigError(f"{where}.mlp_activation={cfg.mlp_activation.value!r}: the "
                                "Llama/Qwen families use swiglu")
    if "E" in cfg.pattern:
        if cfg.router != Router.SOFTMAX or cfg.moe_shared_expert_intermediate_size \
                or cfg.moe_latent_size is not None or cfg.routed_scaling_factor != 1.0:
            raise FamilyConfigError(f"{where}: an MoE layer of the Qwen3-MoE family needs the "
                                    "softmax router, no shared expert, no latent, scaling 1")
        kind = "qwen3_moe"
    elif cfg.qk_norm:
        kind = "qwen3"
    elif cfg.attention_qkv_bias and not cfg.attention_out_bias:
        kind = "qwen2"
    else:
        kind = "llama"
    if kind in ("qwen3", "qwen3_moe", "llama") and cfg.attention_qkv_bias \
            != cfg.attention_out_bias:
        raise FamilyConfigError(f"{where}.attention_out_bias={cfg.attention_out_bias}: {kind} "
                                "has one attention_bias for q, k, v and o")
    if cfg.qk_norm and kind == "llama":
        raise FamilyConfigError(f"{where}.qk_norm=True is Qwen3's")
    if cfg.mlp_bias and kind != "llama":
        raise FamilyConfigError(f"{where}.mlp_bias=True is Llama's only")
    return kind


def to_hf(cfg: ModelConfig) -> dict:
    """The config.json of a Llama/Qwen `cfg` for transformers 5.24."""
    kind = family(cfg)
    if kind is None:
        raise FamilyConfigError("ModelConfig.rope_theta=None: not a Llama/Qwen config")
    rope: dict = {"rope_type": cfg.rope_scaling.value, "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling != RopeScaling.NONE:
        rope["factor"] = cfg.rope_factor
    if cfg.rope_scaling == RopeScaling.LLAMA3:
        rope.update(low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_position)
    if cfg.rotary_dim is not None:
        rope["partial_rotary_factor"] = cfg.rotary_dim / cfg.head_dim
    d = {
        "architectures": [ARCHITECTURES[kind]], "model_type": kind, "dtype": cfg.param_dtype,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": len(cfg.pattern) // 2,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "max_position_embeddings": cfg.max_context,
        "rms_norm_eps": cfg.layer_norm_epsilon, "initializer_range": cfg.initializer_range,
        "tie_word_embeddings": cfg.tie_word_embeddings, "rope_parameters": rope,
        "use_cache": True,
    }
    if kind != "qwen2":
        d["attention_bias"] = cfg.attention_qkv_bias
    if kind == "llama":
        d["mlp_bias"] = cfg.mlp_bias
    if kind == "qwen3_moe":
        d.update(num_experts=cfg.n_routed_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                 moe_intermediate_size=cfg.moe_intermediate_size,
                 norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=1,
                 mlp_only_layers=[i for i in range(len(cfg.pattern) // 2)
                                  if cfg.pattern[2 * i + 1] == "-"])
    return d
