"""avalon -> HF -> avalon without torch: bit-exact round trips (fp32, bf16, MTP, sharded files,
onto a mesh) and errors that name the tensor or file."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.checkpoint import hf, hf_names
from avalon.checkpoint.hf import CheckpointError
from avalon.checkpoint.hf_config import HFConfigError
from avalon.checkpoint.safetensors_io import (
    INDEX_NAME,
    SafetensorsDir,
    SafetensorsError,
    write_sharded,
)
from avalon.model import ModelConfig, abstract_params, param_shardings, presets
from avalon.sharding import make_mesh

# Every layer letter, repeated runs, latent, MTP. The MoE backend is a run-time choice a
# checkpoint does not carry (loading gives ModelConfig's default, AUTO; `hf.load(...,
# moe_backend=...)` picks another), so the round-trip config states the default.
CFG = presets.get("tiny", mtp_pattern="*E", moe_backend=ModelConfig.moe_backend)


def random_params(cfg, seed=0):
    """Every leaf random (no zeros or ones to hide a swapped tensor), built on the host."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(a.dtype)),
                        abstract_params(cfg))


def assert_same_params(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree.leaves_with_path(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                      err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def params():
    return random_params(CFG)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, params):
    path = tmp_path_factory.mktemp("hf") / "tiny"
    hf.save(path, CFG, params, max_shard_bytes=100_000)
    return path


def test_round_trip_is_bit_exact(exported, params):
    assert len(list(exported.glob("*.safetensors"))) > 1  # sharded, with an index
    assert (exported / INDEX_NAME).exists()
    cfg, back = hf.load(exported)
    assert cfg == CFG
    assert_same_params(back, params)


def test_bf16_round_trip_one_layer_at_a_time(tmp_path, monkeypatch):
    """bf16 stays bf16 (router fp32), through the export path that fetches one stacked layer
    of a leaf at a time (the path large leaves take)."""
    cfg = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    params = random_params(cfg, seed=1)
    monkeypatch.setattr(hf, "_WHOLE_LEAF_BYTES", 0)
    hf.save(tmp_path, cfg, params)
    st = SafetensorsDir(tmp_path)
    assert str(st.dtype("backbone.layers.0.mixer.in_proj.weight")) == "bfloat16"
    assert str(st.dtype("backbone.layers.1.mixer.gate.weight")) == "float32"
    got_cfg, back = hf.load(tmp_path)
    assert got_cfg == cfg
    assert_same_params(back, params)


def test_hub_tensor_names_and_shapes(exported):
    """Spot checks of the hub layout against nemotron_h.md section 4.1."""
    st = SafetensorsDir(exported)
    c = CFG
    inner, gn = c.mamba_inner, c.n_groups * c.ssm_state_size
    assert st.shape("backbone.layers.0.mixer.in_proj.weight") == (
        2 * inner + 2 * gn + c.mamba_num_heads, c.hidden_size)
    assert st.shape("backbone.layers.0.mixer.conv1d.weight") == (inner + 2 * gn, 1, c.conv_kernel)
    assert st.shape("backbone.layers.1.mixer.experts.7.up_proj.weight") == (
        c.moe_intermediate_size, c.moe_latent_size)
    assert st.shape("backbone.layers.4.mixer.o_proj.weight") == (
        c.hidden_size, c.num_attention_heads * c.head_dim)
    assert st.shape("mtp.layers.0.eh_proj.weight") == (c.hidden_size, 2 * c.hidden_size)
    assert "mtp.layers.1.final_layernorm.weight" in st
    assert "mtp.layers.1.mixer.experts.0.down_proj.weight" in st
    assert st.shape("lm_head.weight") == (c.vocab_size, c.hidden_size)
    n_layers = len({k.split(".")[2] for k in st.keys() if k.startswith("backbone.layers.")})
    assert n_layers == c.num_layers


def test_in_proj_rows_are_z_x_B_C_dt(exported, params):
    """The fused in_proj is exactly [z; x; B; C; dt] of layer 2 (run 0, repeat 1, position 0),
    each transposed from avalon's [in, out]."""
    st = SafetensorsDir(exported)
    w = st.read("backbone.layers.2.mixer.in_proj.weight")
    m = jax.tree.map(lambda a: np.asarray(a)[1], params["blocks"][0]["0_mamba"])
    d = CFG.hidden_size
    want = np.concatenate([m["in_z"].reshape(d, -1), m["in_x"].reshape(d, -1),
                           m["in_B"].reshape(d, -1), m["in_C"].reshape(d, -1), m["in_dt"]], 1).T
    np.testing.assert_array_equal(w, want)


def test_load_onto_a_mesh(exported, params):
    """fsdp x expert x tensor: each device reads column ranges of fused tensors (in_proj over
    embed), its own experts' keys, and its heads."""
    mesh = make_mesh({"fsdp": 2, "expert": 2, "tensor": 2})
    cfg = CFG.replace(mtp_pattern="")  # TRAIN_RULES map both eh_proj axes to fsdp; see report
    path = exported.parent / "no_mtp"
    if not path.exists():
        shutil.copytree(exported, path)
        d = json.loads((path / "config.json").read_text())
        d["num_nextn_predict_layers"] = 0
        (path / "config.json").write_text(json.dumps(d))
    got_cfg, back = hf.load(path, mesh)  # the mtp.* tensors are ignored, as transformers does
    assert got_cfg == cfg
    want = {k: v for k, v in params.items() if k != "mtp"}
    assert_same_params(back, want)
    shardings = param_shardings(cfg, mesh)
    for leaf, sharding in zip(jax.tree.leaves(back), jax.tree.leaves(shardings)):
        assert leaf.sharding == sharding
    spec = back["blocks"][0]["1_moe"]["experts_up"].sharding.spec
    assert tuple(spec) == (None, "expert", "fsdp", "tensor")


def test_layer_index_mapping():
    # tiny: "MEME*-ME*M" -> runs ("ME", 2), ...: run 0 repeat 1 position 1 is layer 3.
    assert CFG.blocks[0] == ("ME", 2)
    assert hf_names.layer_index(CFG, 0, 1, 1) == 3
    assert hf_names.layer_index(CFG, len(CFG.blocks) - 1, 0, 0) == CFG.num_layers - 1


# ---- errors ---------------------------------------------------------------------------------
def _rewrite(src, dst, edit):
    """Copy checkpoint `src` into `dst` with its tensors passed through `edit(dict)`."""
    st = SafetensorsDir(src)
    tensors = edit({k: st.read(k) for k in st.keys()})
    write_sharded(dst, [(k, v.shape, v.dtype) for k, v in tensors.items()],
                  iter(tensors.values()), max_shard_bytes=1 << 30)
    shutil.copy(src / "config.json", dst / "config.json")


def test_missing_tensor_is_named(exported, tmp_path):
    name = "backbone.layers.3.mixer.experts.5.down_proj.weight"
    _rewrite(exported, tmp_path, lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' is missing.*experts_down"):
        hf.load(tmp_path)


def test_wrong_shape_is_named(exported, tmp_path):
    name = "backbone.layers.4.mixer.q_proj.weight"
    _rewrite(exported, tmp_path, lambda t: {**t, name: t[name][:-16]})
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' has shape \[48, 64\] but "
                                              r"config.json implies \[64, 64\]"):
        hf.load(tmp_path)


def test_unexpected_tensor_is_named(exported, tmp_path):
    name = "backbone.layers.0.mixer.in_proj.bias"
    _rewrite(exported, tmp_path, lambda t: {**t, name: np.zeros(8, np.float32)})
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' is not used"):
        hf.load(tmp_path)


def test_truncated_file_is_named(exported, tmp_path):
    shutil.copytree(exported, tmp_path, dirs_exist_ok=True)
    victim = sorted(tmp_path.glob("*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(SafetensorsError, match=rf"{victim.name}: tensor .* truncated"):
        hf.load(tmp_path)


def test_unknown_layer_letter_is_named(exported, tmp_path):
    shutil.copytree(exported, tmp_path, dirs_exist_ok=True)
    d = json.loads((tmp_path / "config.json").read_text())
    del d["layers_block_type"]
    d["hybrid_override_pattern"] = "MEME*-MX*M"
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(HFConfigError, match=r"unknown layer letter 'X' at index 7"):
        hf.load(tmp_path)


def test_export_refuses_to_overwrite_a_checkpoint(exported, params):
    with pytest.raises(CheckpointError, match="already holds a safetensors checkpoint"):
        hf.save(exported, CFG, params)


def test_export_checks_params_against_the_config(tmp_path, params):
    bad = {**params, "final_norm": params["final_norm"][:-1]}
    with pytest.raises(CheckpointError, match=r"\['final_norm'\] has shape \(63,\)"):
        hf.save(tmp_path, CFG, bad)


def test_tied_embeddings_export_a_head(tmp_path):
    """transformers never ties Nemotron-H's head, so a tied model exports `lm_head.weight`;
    read back it is an untied model with the same values."""
    cfg = CFG.replace(tie_word_embeddings=True, mtp_pattern="")
    params = random_params(cfg, seed=2)
    hf.save(tmp_path, cfg, params)
    np.testing.assert_array_equal(SafetensorsDir(tmp_path).read("lm_head.weight"),
                                  np.asarray(params["embed"]))
    got_cfg, back = hf.load(tmp_path)
    assert got_cfg == cfg.replace(tie_word_embeddings=False)
    np.testing.assert_array_equal(np.asarray(back["lm_head"]), np.asarray(params["embed"]).T)
