"""The safetensors reader/writer: round trips, region reads, sharding, and errors that name the
file; cross-checked against the `safetensors` package when it is installed."""

import json

import ml_dtypes
import numpy as np
import pytest

from avalon.checkpoint.safetensors_io import (
    INDEX_NAME,
    SafetensorsDir,
    SafetensorsError,
    plan_shards,
    write_file,
    write_sharded,
)


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.f32": rng.standard_normal((5, 7)).astype(np.float32),
        "b.bf16": rng.standard_normal((3, 4, 6)).astype(ml_dtypes.bfloat16),
        "c.i64": np.arange(11, dtype=np.int64),
        "d.f8": rng.standard_normal((8,)).astype(ml_dtypes.float8_e4m3fn),
        "e.scalar": np.array(2.5, np.float16),
    }


def _bits(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _specs(t):
    return [(k, v.shape, v.dtype) for k, v in t.items()]


def test_sharded_round_trip_and_region_reads(tmp_path):
    t = _tensors()
    names = write_sharded(tmp_path, _specs(t), iter(t.values()), max_shard_bytes=200)
    assert len(names) > 1 and (tmp_path / INDEX_NAME).exists()
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(t)
    st = SafetensorsDir(tmp_path)
    assert sorted(st.keys()) == sorted(t)
    for k, v in t.items():
        assert st.shape(k) == v.shape and st.dtype(k) == v.dtype
        np.testing.assert_array_equal(_bits(st.read(k)), _bits(v))
    np.testing.assert_array_equal(st.read("b.bf16", [(1, 3), (0, 4), (2, 5)]),
                                  t["b.bf16"][1:3, :, 2:5])


def test_plan_shards_respects_the_size_limit():
    specs = [(str(i), (n,), np.dtype(np.float32)) for i, n in enumerate([10, 10, 30, 5, 5])]
    # 40, 40, 120, 20, 20 bytes; a tensor above the limit gets its own file.
    assert plan_shards(specs, 80) == [[0, 1], [2], [3, 4]]


def test_unindexed_directory_reads_every_file(tmp_path):
    t = _tensors()
    items = list(t.items())
    write_file(tmp_path / "one.safetensors", _specs(dict(items[:2])), [v for _, v in items[:2]])
    write_file(tmp_path / "two.safetensors", _specs(dict(items[2:])), [v for _, v in items[2:]])
    st = SafetensorsDir(tmp_path)
    assert sorted(st.keys()) == sorted(t)
    assert st.file_of("c.i64").name == "two.safetensors"


def test_matches_the_safetensors_package(tmp_path):
    sn = pytest.importorskip("safetensors.numpy")
    t = {k: v for k, v in _tensors().items() if k != "d.f8"}
    write_file(tmp_path / "ours.safetensors", _specs(t), t.values(), {"format": "pt"})
    theirs = sn.load_file(tmp_path / "ours.safetensors")
    for k, v in t.items():
        np.testing.assert_array_equal(_bits(theirs[k]), _bits(v))
    other = tmp_path / "other"
    other.mkdir()
    sn.save_file(t, other / "x.safetensors")
    st = SafetensorsDir(other)
    for k, v in t.items():
        np.testing.assert_array_equal(_bits(st.read(k)), _bits(v))


def test_truncated_file_is_named(tmp_path):
    t = _tensors()
    path = tmp_path / "model.safetensors"
    write_file(path, _specs(t), t.values())
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(SafetensorsError,
                       match=r"model\.safetensors: tensor '.*': file is truncated"):
        SafetensorsDir(tmp_path)
    path.write_bytes(data[:20])  # cut inside the header
    with pytest.raises(SafetensorsError, match=r"model\.safetensors: truncated"):
        SafetensorsDir(tmp_path)


def test_corrupt_header_and_bad_index_are_named(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((6).to_bytes(8, "little") + b"{nope}")
    with pytest.raises(SafetensorsError, match=r"bad\.safetensors: header is not valid JSON"):
        SafetensorsDir(tmp_path)
    path.unlink()
    t = _tensors()
    write_sharded(tmp_path, _specs(t), iter(t.values()), max_shard_bytes=1 << 20)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    index["weight_map"]["a.f32"] = "missing.safetensors"
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(SafetensorsError, match=r"'a\.f32' is in missing\.safetensors"):
        SafetensorsDir(tmp_path)


def test_writer_rejects_a_tensor_unlike_its_declaration(tmp_path):
    with pytest.raises(SafetensorsError, match="'x' declared"):
        write_file(tmp_path / "x.safetensors", [("x", (2,), np.dtype(np.float32))],
                   [np.zeros(3, np.float32)])
    assert not (tmp_path / "x.safetensors").exists()
