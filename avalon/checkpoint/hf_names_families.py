"""The table between avalon params and Hugging Face Llama/Qwen tensors (`hf_families.py`).

Same contract as `hf_names.param_sources` (a tree shaped like the params, a `Source` per leaf,
checked leaf for leaf by `hf_names.check_sources`), for the hub / `save_pretrained` names that
transformers 5.24 reads and writes for LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
Qwen3MoeForCausalLM:

    model.embed_tokens.weight (V, D); model.norm.weight; lm_head.weight (V, D) unless tied
    model.layers.{i}.input_layernorm.weight          -> avalon layer 2i (attention) norm
    model.layers.{i}.self_attn.{q,k,v}_proj.weight   (heads*hd, D) -> [D, heads, hd]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias     (heads*hd)    -> [heads, hd]
    model.layers.{i}.self_attn.o_proj.weight (D, nh*hd) -> [nh, hd, D]; .bias (D)
    model.layers.{i}.self_attn.{q,k}_norm.weight (hd)
    model.layers.{i}.post_attention_layernorm.weight -> avalon layer 2i + 1 (MLP / MoE) norm
    model.layers.{i}.mlp.{gate,up}_proj.weight (F, D) -> [D, F]; down_proj (D, F) -> [F, D]
    model.layers.{i}.mlp.gate.weight (E, D) -> router [D, E]   (MoE)
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight -> experts_{gate,up,down}

Avalon layer L of the pattern is HF layer L // 2.
"""

from __future__ import annotations

import numpy as np

from avalon.checkpoint.hf_names import (
    Source,
    _names,
    _proj_in,
    _proj_out,
    _transposed,
    _vector,
    _whole,
    layer_index,
)
from avalon.model.config import LETTERS, Activation, ModelConfig
from avalon.model.params import layer_key

PREFIX = "model."


def _attention(cfg: ModelConfig, pre: np.ndarray) -> dict[str, Source]:
    d, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, \
        cfg.head_dim
    a = lambda s: _names(pre, "self_attn." + s)
    out = {
        "norm": Source(_names(pre, "input_layernorm.weight"), _whole(d)),
        "q": Source(a("q_proj.weight"), _proj_in(nh * hd, d, (nh, hd))),
        "k": Source(a("k_proj.weight"), _proj_in(nkv * hd, d, (nkv, hd))),
        "v": Source(a("v_proj.weight"), _proj_in(nkv * hd, d, (nkv, hd))),
        "o": Source(a("o_proj.weight"), _proj_out(d, nh * hd, (nh, hd))),
    }
    if cfg.attention_qkv_bias:
        out["q_bias"] = Source(a("q_proj.bias"), _vector(nh * hd, (nh, hd)))
        out["k_bias"] = Source(a("k_proj.bias"), _vector(nkv * hd, (nkv, hd)))
        out["v_bias"] = Source(a("v_proj.bias"), _vector(nkv * hd, (nkv, hd)))
    if cfg.attention_out_bias:
        out["o_bias"] = Source(a("o_proj.bias"), _whole(d))
    if cfg.qk_norm:
        out["q_norm"] = Source(a("q_norm.weight"), _whole(hd))
        out["k_norm"] = Source(a("k_norm.weight"), _whole(hd))
    return out


def _mlp(cfg: ModelConfig, pre: np.ndarray) -> dict[str, Source]:
    d, f = cfg.hidden_size, cfg.intermediate_size
    m = lambda s: _names(pre, "mlp." + s)
    out = {
        "norm": Source(_names(pre, "post_attention_layernorm.weight"), _whole(d)),
        "gate": Source(m("gate_proj.weight"), _transposed(f, d)),
        "up": Source(m("up_proj.weight"), _transposed(f, d)),
        "down": Source(m("down_proj.weight"), _transposed(d, f)),
    }
    if cfg.mlp_bias:
        out["gate_bias"] = Source(m("gate_proj.bias"), _whole(f))
        out["up_bias"] = Source(m("up_proj.bias"), _whole(f))
        out["down_bias"] = Source(m("down_proj.bias"), _whole(d))
    return out


def _moe(cfg: ModelConfig, pre: np.ndarray) -> dict[str, Source]:
    d, e, f = cfg.hidden_size, cfg.n_routed_experts, cfg.moe_intermediate_size

    def per_expert(suffix: str) -> np.ndarray:
        flat = [f"{p}mlp.experts.{x}.{suffix}" for p in pre.flat for x in range(e)]
        return np.array(flat, dtype=object).reshape(*pre.shape, e)

    out = {
        "norm": Source(_names(pre, "post_attention_layernorm.weight"), _whole(d)),
        "router": Source(_names(pre, "mlp.gate.weight"), _transposed(e, d)),
        "experts_up": Source(per_expert("up_proj.weight"), _transposed(f, d)),
        "experts_down": Source(per_expert("down_proj.weight"), _transposed(d, f)),
    }
    if cfg.mlp_activation == Activation.SWIGLU:
        out["experts_gate"] = Source(per_expert("gate_proj.weight"), _transposed(f, d))
    return out


_TABLES = {"attention": _attention, "mlp": _mlp, "moe": _moe}


def param_sources(cfg: ModelConfig) -> dict:
    """A tree shaped like the params of a Llama/Qwen `cfg`, with a `Source` per leaf."""
    d, v = cfg.hidden_size, cfg.vocab_size
    scalar = lambda name: np.array(name, dtype=object)
    tree: dict = {
        "embed": Source(scalar(f"{PREFIX}embed_tokens.weight"), _whole(v, d)),
        "blocks": [],
        "final_norm": Source(scalar(f"{PREFIX}norm.weight"), _whole(d)),
    }
    for b, (unit, reps) in enumerate(cfg.blocks):
        run = {}
        for j, ch in enumerate(unit):
            pre = np.array([f"{PREFIX}layers.{layer_index(cfg, b, r, j) // 2}."
                            for r in range(reps)], dtype=object)
            run[layer_key(j, ch)] = _TABLES[LETTERS[ch]](cfg, pre)
        tree["blocks"].append(run)
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = Source(scalar("lm_head.weight"), _transposed(v, d))
    return tree
