"""Hugging Face `NemotronHConfig` (config.json) <-> avalon `ModelConfig`.

Reading follows transformers 5.24 (`configuration_nemotron_h.py`):
  * the layer stack comes from `layers_block_type` (a list of `linear_attention`, `moe`,
    `full_attention`, `mlp`, or the legacy `mamba`, `attention`) or, when that is absent, from
    the hub's `hybrid_override_pattern` string (`M E * -`);
  * legacy `mamba_*` keys (`mamba_n_groups`, `mamba_d_conv`, ...) override their new names, as
    HF's `__post_init__` does; old Nemotron-H configs' `attention_head_dim` stands for `head_dim`;
  * `{"__float__": "Infinity"}` (how 5.24 writes infinity) is decoded to a float;
  * the MTP block (`num_nextn_predict_layers` = 1) is `mtp_layers_block_type` or
    `mtp_hybrid_override_pattern`, default `*E`.
Missing fields take HF 5.24's defaults (`HF_DEFAULTS`), so a config loads as transformers would
load it; only `vocab_size`, `hidden_size` and the layer stack are required. Keys HF reads but
never uses in the forward pass (`attention_bias`, `time_step_limit`, `residual_in_fp32`, ...)
and keys avalon does not know are ignored. Activations other than HF's (`silu`, `relu2`) are
rejected, since the model implements only those.

Writing produces the 5.24 style (`layers_block_type`, `mtp_layers_block_type`, infinity as
`{"__float__": ...}`) plus `hybrid_override_pattern`, `mtp_hybrid_override_pattern` and
`num_hidden_layers`, which older readers (remote code, vLLM) need and 5.24 accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping

from avalon.checkpoint import hf_families
from avalon.model.config import ModelConfig

LAYER_TYPES = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
# Legacy key -> 5.24 key; the legacy key wins when both are present (as in HF).
LEGACY_KEYS = {
    "mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
    "mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max",
    "mamba_dt_limit": "time_step_limit", "mamba_dt_init_floor": "time_step_floor",
    "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size",
}
DEFAULT_MTP_TYPES = ["full_attention", "moe"]

# HF 5.24 field defaults for every field the model reads.
HF_DEFAULTS = {
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 21504, "ssm_state_size": 128, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
    "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4,
    "use_conv_bias": True, "use_bias": False, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
    "moe_latent_size": None, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "mlp_bias": False, "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False, "initializer_range": 0.02, "rescale_prenorm_residual": True,
    "max_position_embeddings": 4096, "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2",
    "num_nextn_predict_layers": 0,
}
REQUIRED = ("vocab_size", "hidden_size")

# ModelConfig fields that carry an HF field of the same name, with the expected JSON type.
_INT_FIELDS = (
    "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "conv_kernel", "chunk_size", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_group", "topk_group",
)
_FLOAT_FIELDS = ("time_step_min", "time_step_max", "time_step_floor", "routed_scaling_factor",
                 "layer_norm_epsilon", "initializer_range")
_BOOL_FIELDS = ("use_conv_bias", "use_bias", "norm_topk_prob", "mlp_bias",
                "tie_word_embeddings", "rescale_prenorm_residual")
_DTYPES = ("float32", "bfloat16", "float16", "float64")


class HFConfigError(ValueError):
    """config.json cannot describe an avalon model; the message names the key and value."""


# ---- JSON with HF's encoding of non-finite floats ------------------------------------------
def _decode_float(obj: dict):
    if set(obj) == {"__float__"}:
        return float(obj["__float__"])  # "Infinity", "-Infinity", "NaN"
    return obj


def _encode_floats(x):
    if isinstance(x, float) and not math.isfinite(x):
        return {"__float__": "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")}
    if isinstance(x, Mapping):
        return {k: _encode_floats(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode_floats(v) for v in x]
    return x


def read_json(path: str | os.PathLike) -> dict:
    """A config.json as a dict, with `{"__float__": "Infinity"}` decoded to float('inf')."""
    try:
        with open(path) as f:
            return json.load(f, object_hook=_decode_float)
    except json.JSONDecodeError as e:
        raise HFConfigError(f"{path}: not valid JSON ({e})") from None


def write_json(path: str | os.PathLike, d: Mapping) -> None:
    """Write a config dict the way transformers 5.24 does (sorted keys, non-finite floats as
    `{"__float__": ...}`)."""
    text = json.dumps(_encode_floats(d), indent=2, sort_keys=True, allow_nan=False)
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


# ---- HF dict -> ModelConfig -----------------------------------------------------------------
def _layer_letters(types, key: str, source: str) -> str:
    if not isinstance(types, list) or not types:
        raise HFConfigError(f"{source}: {key!r}={types!r} must be a non-empty list of layer types")
    out = []
    for i, t in enumerate(types):
        t = LEGACY_LAYER_TYPES.get(t, t)
        if t not in LAYER_TYPES:
            raise HFConfigError(f"{source}: {key}[{i}]={t!r} is an unknown layer type; use one "
                                f"of {sorted(LAYER_TYPES)}")
        out.append(LAYER_TYPES[t])
    return "".join(out)


def _pattern_letters(pattern, key: str, source: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise HFConfigError(f"{source}: {key!r}={pattern!r} must be a non-empty string")
    for i, ch in enumerate(pattern):
        if ch not in "ME*-":
            raise HFConfigError(f"{source}: {key}={pattern!r} has an unknown layer letter {ch!r} "
                                f"at index {i}; use M (Mamba), E (MoE), * (attention), - (MLP)")
    return pattern


def checkpoint_dtype(d: Mapping) -> str | None:
    """The params dtype a config declares (`dtype`, or 4.x's `torch_dtype`), or None."""
    v = d.get("dtype", d.get("torch_dtype"))
    if v is None:
        return None
    v = str(v).removeprefix("torch.")
    return v if v in _DTYPES else None


def normalize(d: Mapping, source: str = "config.json") -> dict:
    """HF keys with legacy names resolved and HF defaults filled in (no type checks yet)."""
    out = dict(d)
    for old, new in LEGACY_KEYS.items():
        if old in out:
            out[new] = out.pop(old)
    if "head_dim" not in out and "attention_head_dim" in out:
        out["head_dim"] = out["attention_head_dim"]
    for k in REQUIRED:
        if k not in out:
            raise HFConfigError(f"{source}: required key {k!r} is missing")
    for k, v in HF_DEFAULTS.items():
        out.setdefault(k, v)
    if out.get("num_key_value_heads") is None:  # HF: None means as many as query heads
        out["num_key_value_heads"] = out["num_attention_heads"]
    return out


def from_hf(d: Mapping, *, source: str = "config.json", **overrides) -> ModelConfig:
    """A `ModelConfig` from a config.json dict. `overrides` set any ModelConfig field (e.g.
    `param_dtype`, `moe_backend`, `max_context`); `dtype` (activations) follows `param_dtype`
    unless given. The params dtype defaults to the config's `dtype`/`torch_dtype`, else fp32."""
    if d.get("model_type") in hf_families.MODEL_TYPES:
        try:
            return hf_families.from_hf(d, source=source, checkpoint_dtype=checkpoint_dtype(d),
                                      **overrides)
        except hf_families.FamilyConfigError as e:
            raise HFConfigError(str(e)) from None
    h = normalize(d, source)
    if h.get("model_type", "nemotron_h") != "nemotron_h":
        raise HFConfigError(f"{source}: 'model_type'={h['model_type']!r} is not supported; use "
                            f"one of nemotron_h, {', '.join(hf_families.MODEL_TYPES)}")
    if "layers_block_type" in h and h["layers_block_type"] is not None:
        pattern = _layer_letters(h["layers_block_type"], "layers_block_type", source)
    elif "hybrid_override_pattern" in h:
        pattern = _pattern_letters(h["hybrid_override_pattern"], "hybrid_override_pattern",
                                   source)
    else:
        raise HFConfigError(f"{source}: the layer stack is missing: give 'layers_block_type' "
                            "or 'hybrid_override_pattern'")

    mtp_pattern = ""
    n_mtp = hf_families.typed(h, "num_nextn_predict_layers", int, source, HFConfigError)
    if n_mtp > 1:
        raise HFConfigError(f"{source}: 'num_nextn_predict_layers'={n_mtp}: avalon has one MTP "
                            "block (Nemotron 3 Super has 1)")
    if n_mtp == 1:
        types = h.get("mtp_layers_block_type")
        if types is not None and [LEGACY_LAYER_TYPES.get(t, t) for t in types] \
                != DEFAULT_MTP_TYPES:
            mtp_pattern = _layer_letters(types, "mtp_layers_block_type", source)
        elif "mtp_hybrid_override_pattern" in h:
            mtp_pattern = _pattern_letters(h["mtp_hybrid_override_pattern"],
                                           "mtp_hybrid_override_pattern", source)
        else:
            mtp_pattern = _layer_letters(DEFAULT_MTP_TYPES, "mtp_layers_block_type", source)

    for key, want in (("mamba_hidden_act", "silu"), ("mlp_hidden_act", "relu2")):
        if h[key] != want:
            raise HFConfigError(f"{source}: {key!r}={h[key]!r} is not supported (only {want!r})")

    kw: dict = {"pattern": pattern, "mtp_pattern": mtp_pattern}
    for k in _INT_FIELDS:
        kw[k] = hf_families.typed(h, k, int, source, HFConfigError)
    for k in _FLOAT_FIELDS:
        kw[k] = hf_families.typed(h, k, float, source, HFConfigError)
    for k in _BOOL_FIELDS:
        kw[k] = hf_families.typed(h, k, bool, source, HFConfigError)
    kw["moe_latent_size"] = None if h["moe_latent_size"] is None else \
        hf_families.typed(h, "moe_latent_size", int, source, HFConfigError)
    kw["max_context"] = hf_families.typed(h, "max_position_embeddings", int, source, HFConfigError)
    kw["param_dtype"] = checkpoint_dtype(h) or "float32"

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for k in overrides:
        if k not in fields:
            raise HFConfigError(f"override {k!r} is not a ModelConfig field")
    kw.update(overrides)
    kw.setdefault("dtype", kw["param_dtype"])
    try:
        return ModelConfig(**kw)
    except ValueError as e:
        raise HFConfigError(f"{source}: {e}") from None


# ---- ModelConfig -> HF dict -----------------------------------------------------------------
def to_hf(cfg: ModelConfig) -> dict:
    """The config.json of `cfg` for transformers 5.24 (and older readers)."""
    if hf_families.family(cfg) is not None:
        return hf_families.to_hf(cfg)
    types = {v: k for k, v in LAYER_TYPES.items()}
    d = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "dtype": cfg.param_dtype,
        "layers_block_type": [types[c] for c in cfg.pattern],
        "hybrid_override_pattern": cfg.pattern,
        "num_hidden_layers": cfg.num_layers,
        "max_position_embeddings": cfg.max_context,
        "moe_latent_size": cfg.moe_latent_size,
        "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2",
        "n_shared_experts": 1,
        "expand": 2,
        "time_step_limit": [0.0, float("inf")],
        "use_cache": True,
        "num_nextn_predict_layers": 1 if cfg.mtp_pattern else 0,
    }
    for k in _INT_FIELDS + _FLOAT_FIELDS + _BOOL_FIELDS:
        d[k] = getattr(cfg, k)
    if cfg.mtp_pattern:
        d["mtp_layers_block_type"] = [types[c] for c in cfg.mtp_pattern]
        d["mtp_hybrid_override_pattern"] = cfg.mtp_pattern
    return d
