"""`python -m avalon.tools.convert`: HF -> avalon -> HF is lossless, keeps the source's extra
config keys and tokenizer files, and draws a progress bar."""

import jax
import ml_dtypes
import numpy as np
import pytest
from absl import flags

from avalon.checkpoint import avalon_format, hf
from avalon.checkpoint.hf_config import read_json, write_json
from avalon.checkpoint.safetensors_io import SafetensorsDir
from avalon.tools import convert

from .test_hf_roundtrip import CFG, assert_same_params, random_params


def _run(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["convert", *args])
    try:
        convert.main([])
    finally:
        flags.FLAGS.unparse_flags()


def test_hf_to_avalon_to_hf(tmp_path, capsys):
    src, mid, out = tmp_path / "src", tmp_path / "avalon", tmp_path / "out"
    params = random_params(CFG, seed=3)
    hf.save(src, CFG, params, max_shard_bytes=100_000,
            extra_config={"eos_token_id": [2, 11], "rope_theta": 10000})
    hub_config = read_json(src / "config.json")
    write_json(src / "config.json", {**hub_config, "auto_map": {"AutoConfig": "remote.Config"}})
    (src / "tokenizer.json").write_text('{"version": "1.0"}')

    _run(f"--src={src}", f"--dst={mid}", "--to=avalon", "--mesh=data=2,tensor=4")
    n_leaves = len(jax.tree.leaves(params))
    assert f"reading HF [{'#' * 30}] {n_leaves}/{n_leaves} tensors" in capsys.readouterr().err
    cfg, back = avalon_format.load_avalon(mid)
    assert cfg == CFG
    assert_same_params(back, params)
    assert (mid / "tokenizer.json").read_text() == '{"version": "1.0"}'

    _run(f"--src={mid}", f"--dst={out}", "--to=hf", "--max_shard_gb=0.0001")
    a, b = SafetensorsDir(src), SafetensorsDir(out)
    assert sorted(a.keys()) == sorted(b.keys())
    assert f"{len(a.keys())}/{len(a.keys())} tensors" in capsys.readouterr().err
    for k in a.keys():
        assert a.dtype(k) == b.dtype(k), k
        np.testing.assert_array_equal(a.read(k), b.read(k), err_msg=k)
    got = read_json(out / "config.json")
    assert got["eos_token_id"] == [2, 11] and got["rope_theta"] == 10000
    assert "auto_map" not in got  # remote code would not describe the exported weights
    assert got == hub_config
    assert (out / "tokenizer.json").exists()


def test_cast_on_export(tmp_path):
    mid = tmp_path / "avalon"
    params = random_params(CFG)
    avalon_format.save_avalon(mid, CFG, params)
    convert.convert(mid, tmp_path / "out", convert.Target.HF, param_dtype="bfloat16",
                    progress=False)
    st = SafetensorsDir(tmp_path / "out")
    np.testing.assert_array_equal(st.read("backbone.embeddings.weight"),
                                  np.asarray(params["embed"]).astype(ml_dtypes.bfloat16))
    assert str(st.dtype("backbone.layers.1.mixer.gate.e_score_correction_bias")) == "float32"
    assert read_json(tmp_path / "out" / "config.json")["dtype"] == "bfloat16"


def test_wrong_source_kind_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="is not an avalon checkpoint"):
        convert.convert(tmp_path, tmp_path / "out", convert.Target.HF)
    with pytest.raises(ValueError, match=r"--mesh='tensor:2'"):
        convert.parse_mesh("tensor:2")
