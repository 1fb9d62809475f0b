"""config.json <-> ModelConfig: both layer-stack spellings, legacy names, HF's infinity, MTP,
and errors that name the key."""

import json

import pytest

from avalon.checkpoint import hf_config
from avalon.checkpoint.hf_config import HFConfigError, from_hf, read_json, to_hf, write_json
from avalon.model import MoeBackend, presets

# A hub-era config (transformers 4.x remote code): pattern string, legacy mamba_* names.
HUB = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "vocab_size": 128, "hidden_size": 64, "hybrid_override_pattern": "MEM*E-",
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 96, "mamba_num_heads": 8, "mamba_head_dim": 16,
    "ssm_state_size": 16, "mamba_n_groups": 2, "mamba_d_conv": 3, "mamba_chunk_size": 8,
    "mamba_dt_min": 0.002, "mamba_conv_bias": False, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48, "moe_latent_size": 24, "n_group": 2,
    "topk_group": 1, "routed_scaling_factor": 2.5, "torch_dtype": "bfloat16",
    "rope_theta": 10000, "eos_token_id": [2, 11], "max_position_embeddings": 512,
}


def test_hub_config_with_legacy_names():
    cfg = from_hf(HUB)
    assert cfg.pattern == "MEM*E-"
    assert (cfg.n_groups, cfg.conv_kernel, cfg.chunk_size) == (2, 3, 8)
    assert cfg.time_step_min == 0.002 and cfg.use_conv_bias is False
    assert cfg.moe_latent_size == 24 and (cfg.n_group, cfg.topk_group) == (2, 1)
    assert cfg.param_dtype == "bfloat16" and cfg.dtype == "bfloat16"
    assert cfg.max_context == 512 and cfg.mtp_pattern == ""
    # Fields the config leaves out take transformers 5.24's defaults.
    assert cfg.layer_norm_epsilon == 1e-5 and cfg.norm_topk_prob is True


def test_legacy_key_wins_over_the_new_name_as_in_transformers():
    assert from_hf({**HUB, "n_groups": 4}).n_groups == 2


def test_524_style_config_file_with_infinity(tmp_path):
    """What `save_pretrained` writes: a `layers_block_type` list and `{"__float__": ...}`."""
    d = {k: v for k, v in HUB.items() if k != "hybrid_override_pattern"}
    d["layers_block_type"] = ["mamba", "moe", "linear_attention", "attention", "moe", "mlp"]
    d["time_step_limit"] = [0.0, {"__float__": "Infinity"}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    raw = read_json(path)
    assert raw["time_step_limit"] == [0.0, float("inf")]
    assert from_hf(raw) == from_hf(HUB)


def test_layers_block_type_wins_over_the_pattern():
    d = {**HUB, "layers_block_type": ["linear_attention"] * 6}
    assert from_hf(d).pattern == "MMMMMM"


def test_write_json_encodes_infinity_like_transformers(tmp_path):
    write_json(tmp_path / "c.json", {"time_step_limit": [0.0, float("inf")]})
    assert json.loads((tmp_path / "c.json").read_text()) == {
        "time_step_limit": [0.0, {"__float__": "Infinity"}]}


def test_mtp_fields():
    one = {**HUB, "num_nextn_predict_layers": 1}
    assert from_hf(one).mtp_pattern == "*E"  # HF's default MTP block
    assert from_hf({**one, "mtp_hybrid_override_pattern": "*E-"}).mtp_pattern == "*E-"
    assert from_hf({**one, "mtp_layers_block_type": ["moe"]}).mtp_pattern == "E"
    # MTP fields without num_nextn_predict_layers describe no MTP block.
    assert from_hf({**HUB, "mtp_hybrid_override_pattern": "*E"}).mtp_pattern == ""


@pytest.mark.parametrize("name", ["tiny", "toy", "nemotron3_nano_30b_a3b",
                                  "nemotron3_super_120b_a12b"])
def test_to_hf_then_from_hf_gives_the_config_back(name):
    cfg = presets.get(name)
    back = from_hf(to_hf(cfg), moe_backend=cfg.moe_backend, dtype=cfg.dtype)
    assert back == cfg


def test_overrides_set_implementation_fields():
    cfg = from_hf(HUB, moe_backend=MoeBackend.DENSE, param_dtype="float32")
    assert cfg.moe_backend == MoeBackend.DENSE
    assert cfg.param_dtype == "float32" and cfg.dtype == "float32"
    with pytest.raises(HFConfigError, match="'not_a_field'"):
        from_hf(HUB, not_a_field=1)


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": None}, r"required key 'hidden_size' is missing"),
    ({"hybrid_override_pattern": "MEX"}, r"unknown layer letter 'X' at index 2"),
    ({"hybrid_override_pattern": None}, r"the layer stack is missing"),
    ({"layers_block_type": ["linear_attention", "ssm"]},
     r"layers_block_type\[1\]='ssm' is an unknown layer type"),
    ({"hidden_size": "64"}, r"'hidden_size'='64' must be an integer"),
    ({"use_bias": 1}, r"'use_bias'=1 must be true or false"),
    ({"mlp_hidden_act": "gelu"}, r"'mlp_hidden_act'='gelu' is not supported"),
    ({"num_nextn_predict_layers": 2}, r"'num_nextn_predict_layers'=2"),
    ({"mamba_num_heads": 7}, r"n_groups=2.*mamba_num_heads=7"),
    ({"model_type": "gpt2"}, r"'model_type'='gpt2' is not supported"),
])
def test_bad_configs_name_the_key(change, message):
    d = dict(HUB)
    for k, v in change.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    with pytest.raises(HFConfigError, match=message):
        from_hf(d)


def test_checkpoint_dtype_reads_both_spellings():
    assert hf_config.checkpoint_dtype({"dtype": "float32"}) == "float32"
    assert hf_config.checkpoint_dtype({"torch_dtype": "torch.bfloat16"}) == "bfloat16"
    assert hf_config.checkpoint_dtype({}) is None
