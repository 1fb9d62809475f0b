"""Parameter and FLOP accounting against the published figures (no weights allocated)."""

import json

from avalon.checkpoint import hf_config
from avalon.model import accounting, presets
from avalon.tools.model_info import model_info


def test_super_parameter_counts():
    counts = accounting.param_counts(presets.get("nemotron3_super_120b_a12b"))
    assert counts["total"] == 120_668_707_840
    # The report read 123,611,012,096 from the safetensors metadata (MTP included).
    assert abs(counts["total_with_mtp"] - 123_611_012_096) / 123_611_012_096 < 1e-5


def test_nano_counts_and_training_flops():
    cfg = presets.get("nemotron3_nano_30b_a3b")
    counts = accounting.param_counts(cfg)
    assert round(counts["total"] / 1e9, 1) == 31.6
    assert round(counts["active"] / 1e9, 1) == 3.2  # NVIDIA's figure (3.6B with embeddings)
    flops = accounting.train_flops_per_token(cfg, 4096)
    assert abs(flops - 20.2e9) / 20.2e9 < 0.05


def test_benchmark_configs_match_performance_notes():
    dense = presets.get("dense_1b")
    assert round(accounting.param_counts(dense)["total"] / 1e9, 2) == 1.29
    assert abs(accounting.train_flops_per_token(dense, 4096) - 6.95e9) / 6.95e9 < 0.01
    hybrid = presets.get("hybrid_2b_a06b")
    counts = accounting.param_counts(hybrid)
    assert round(counts["total"] / 1e9, 2) == 2.16
    assert round(counts["active"] / 1e9, 2) == 0.59
    # performance.md: decode roofline at 256 slots, 8K context is about 5.0 ms per step.
    assert 4.5e-3 < accounting.decode_roofline_s(hybrid, 256, 8192) < 5.5e-3


def test_active_counts_only_chosen_experts():
    cfg = presets.get("tiny")
    full = accounting.param_counts(cfg)
    dense_equiv = accounting.param_counts(cfg.replace(num_experts_per_tok=cfg.n_routed_experts,
                                                      n_group=1, topk_group=1))
    assert dense_equiv["active"] - full["active"] == cfg.count("E") * (
        cfg.n_routed_experts - cfg.num_experts_per_tok) * 2 * cfg.expert_width \
        * cfg.moe_intermediate_size


def test_model_info_is_json():
    info = model_info("nemotron3_super_120b_a12b", batch=4, context=1024)
    json.dumps(info)
    assert info["layers"] == {"mamba": 40, "moe": 40, "attention": 8, "mlp": 0}
    assert info["decode"]["step_bytes"]["total"] > info["decode"]["step_bytes"]["weights"]


def test_llama_family_counts_match_transformers():
    """SwiGLU's three matrices, q/k norms, biases, tied embeddings and softmax experts without a
    shared expert: the parameter count equals transformers' for the same configs, and the
    SmolLM2 preset is the published 134,515,008 (HuggingFaceTB/SmolLM2-135M-Instruct)."""
    import pytest
    transformers = pytest.importorskip("transformers")
    assert accounting.param_counts(presets.get("smollm2_135m"))["total"] == 134_515_008
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    for cls, extra in ((transformers.Qwen2Config, {}),
                       (transformers.Qwen3Config, {"tie_word_embeddings": True}),
                       (transformers.Qwen3MoeConfig, {"moe_intermediate_size": 24,
                                                      "num_experts": 8, "mlp_only_layers": [1]})):
        hf_cfg = cls(**common, **extra)
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
        cfg = hf_config.from_hf(hf_cfg.to_dict())
        assert accounting.param_counts(cfg)["total"] == model.num_parameters(), cls.__name__


def test_training_flops_are_the_compiled_steps_matmuls():
    """The MFU's numerator (`train_flops_per_token` x tokens) against the dot FLOPs of the
    compiled forward and gradient of a Llama-family model (attention, SwiGLU, tied head; every
    weight a matmul): XLA computes the whole S x S score and value products where the
    accounting, by its causal convention, counts the average context S / 2, so the compiled
    count is the accounting's plus that masked half; the gradient is exactly 3 x the forward."""
    import jax
    import jax.numpy as jnp

    from avalon.model import model
    from avalon.model.params import init_params
    from experiments.scale import hlo_stats

    cfg = presets.get("tiny_llama")
    b, s = 2, 64
    params = init_params(jax.random.key(0), cfg)
    tokens = jax.random.randint(jax.random.key(1), (b, s), 0, cfg.vocab_size)

    def loss(p, t):
        logp = jax.nn.log_softmax(model.forward(p, t, cfg).logits)
        return -jnp.mean(jnp.take_along_axis(logp, jnp.roll(t, -1, 1)[..., None], -1))

    def dot_flops(fn):
        return hlo_stats.analyse(jax.jit(fn).lower(params, tokens).compile().as_text()).flops

    masked_half = cfg.count("*") * 4 * cfg.num_attention_heads * cfg.head_dim * (s / 2)
    forward = accounting.forward_flops_per_token(cfg, s)
    compiled = (forward + masked_half) * b * s
    assert dot_flops(lambda p, t: model.forward(p, t, cfg).logits) == compiled
    assert dot_flops(jax.grad(loss)) == 3 * compiled
    assert accounting.train_flops_per_token(cfg, s) == 3 * forward
