"""Named model configurations: `get(name)` returns a `ModelConfig`.

- `tiny`: unit tests (every layer letter, repeated runs to exercise the layer scan).
- `toy`: CPU organisations (a few million parameters, compact vocabulary, short window).
- `hybrid_2b_a06b`, `dense_1b`: benchmark configs of `shared/reference/performance.md`.
- `nemotron3_nano_30b_a3b`, `nemotron3_super_120b_a12b`: the published NVIDIA models.
- `tiny_llama`, `tiny_qwen3_moe`: unit tests of the Llama/Qwen families (rotary attention,
  SwiGLU, q/k norm, softmax routing).
- `smollm2_135m`: SmolLM2-135M-Instruct's shapes (Llama architecture; the weights come from its
  GGUF file or Hugging Face directory through `avalon.checkpoint`).
"""

from __future__ import annotations

from avalon.model.config import Activation, ModelConfig, MoeBackend, Router

NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
SUPER_PATTERN = (
    "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
)


def _tiny() -> ModelConfig:
    return ModelConfig(
        vocab_size=128, hidden_size=64, pattern="MEME*-ME*M",
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
        mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
        chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, moe_latent_size=24, routed_scaling_factor=2.5,
        n_group=2, topk_group=1, max_context=256,
        # Pinned (not AUTO): the unit tests' exact decode == forward checks were set on it.
        moe_backend=MoeBackend.RAGGED_DOT)


def _toy() -> ModelConfig:
    # ~0.94M parameters (0.54M active): sized so an RLCR step of the toy organisation (tens of
    # thousands of tokens through the engine and the update) takes seconds on 2 CPU cores.
    return ModelConfig(
        vocab_size=512, hidden_size=128, pattern="MEM*ME",
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
        mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=1, conv_kernel=4,
        chunk_size=32, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
        moe_shared_expert_intermediate_size=128, routed_scaling_factor=1.0, max_context=2048)


def _hybrid_2b_a06b() -> ModelConfig:
    # performance.md: d 1536; 10 Mamba-2 (H 48, P 64, N 128, G 8) + 10 MoE (64 experts top-6,
    # I 768, shared 1536) + 4 attention (12 q / 2 kv x 128); V 131072 untied.
    return ModelConfig(
        vocab_size=131072, hidden_size=1536, pattern="MEME*" * 4 + "MEME",
        num_attention_heads=12, num_key_value_heads=2, head_dim=128, intermediate_size=4096,
        mamba_num_heads=48, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
        chunk_size=128, n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=768,
        moe_shared_expert_intermediate_size=1536, routed_scaling_factor=2.5,
        param_dtype="bfloat16", dtype="bfloat16",
        max_context=131072)


def _dense_1b() -> ModelConfig:
    # performance.md's control: d 2048, 16 attention+MLP layers, 16 q / 8 kv x 128, SwiGLU 5632.
    # Nemotron-H MLPs are non-gated squared-ReLU; width 8448 = 1.5 x 5632 gives the same
    # parameter and FLOP count as the SwiGLU (3 matrices of 5632 = 2 matrices of 8448).
    return ModelConfig(
        vocab_size=131072, hidden_size=2048, pattern="*-" * 16,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=8448,
        mamba_num_heads=1, mamba_head_dim=1, ssm_state_size=1, n_groups=1,
        param_dtype="bfloat16", dtype="bfloat16", max_context=131072)


def _nano() -> ModelConfig:
    return ModelConfig(
        vocab_size=131072, hidden_size=2688, pattern=NANO_PATTERN,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=1856,
        mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
        chunk_size=128, n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
        moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5,
        param_dtype="bfloat16", dtype="bfloat16",
        max_context=131072)


def _super() -> ModelConfig:
    return ModelConfig(
        vocab_size=131072, hidden_size=4096, pattern=SUPER_PATTERN,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=5376,
        mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
        chunk_size=128, n_routed_experts=512, num_experts_per_tok=22, moe_intermediate_size=2688,
        moe_shared_expert_intermediate_size=5376, moe_latent_size=1024, routed_scaling_factor=5.0,
        mtp_pattern="*E", param_dtype="bfloat16", dtype="bfloat16",
        max_context=131072)


def _tiny_llama() -> ModelConfig:
    # Every Llama/Qwen attention option at once (biases, q/k norm, partial llama3 rotation) so
    # one preset exercises them all; the HF parity tests use the real classes' option sets.
    return ModelConfig(
        vocab_size=128, hidden_size=64, pattern="*-" * 3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=1,
        mamba_head_dim=1, ssm_state_size=1, n_groups=1, mlp_activation=Activation.SWIGLU,
        rope_theta=10000.0, rotary_dim=8, attention_qkv_bias=True, qk_norm=True,
        tie_word_embeddings=True, rescale_prenorm_residual=False, layer_norm_epsilon=1e-6,
        max_context=256)


def _tiny_qwen3_moe() -> ModelConfig:
    return ModelConfig(
        vocab_size=128, hidden_size=64, pattern="*E*-*E*E", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=1,
        mamba_head_dim=1, ssm_state_size=1, n_groups=1, mlp_activation=Activation.SWIGLU,
        router=Router.SOFTMAX, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=0, norm_topk_prob=True,
        rope_theta=1000000.0, qk_norm=True, rescale_prenorm_residual=False,
        layer_norm_epsilon=1e-6, max_context=256)


def _smollm2_135m() -> ModelConfig:
    # HuggingFaceTB/SmolLM2-135M-Instruct: 30 Llama layers, d 576, 9 q / 3 kv heads x 64,
    # SwiGLU 1536, RoPE theta 100,000, tied embeddings, vocabulary 49,152, context 8,192.
    return ModelConfig(
        vocab_size=49152, hidden_size=576, pattern="*-" * 30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, intermediate_size=1536, mamba_num_heads=1,
        mamba_head_dim=1, ssm_state_size=1, n_groups=1, mlp_activation=Activation.SWIGLU,
        rope_theta=100000.0, tie_word_embeddings=True, rescale_prenorm_residual=False,
        layer_norm_epsilon=1e-5, initializer_range=0.041666666666666664, max_context=8192)


_PRESETS = {
    "tiny": _tiny,
    "toy": _toy,
    "hybrid_2b_a06b": _hybrid_2b_a06b,
    "dense_1b": _dense_1b,
    "nemotron3_nano_30b_a3b": _nano,
    "nemotron3_super_120b_a12b": _super,
    "tiny_llama": _tiny_llama,
    "tiny_qwen3_moe": _tiny_qwen3_moe,
    "smollm2_135m": _smollm2_135m,
}

NAMES = tuple(_PRESETS)


def get(name: str, **overrides) -> ModelConfig:
    """The preset `name`, with any field replaced by `overrides`."""
    if name not in _PRESETS:
        raise ValueError(f"model preset {name!r} is unknown; choose one of {', '.join(NAMES)}")
    return _PRESETS[name]().replace(**overrides)
