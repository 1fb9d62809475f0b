"""AOT-compile `hybrid_2b_a06b`'s update step for a v5p-8 (4 chips) from this CPU host.

Checks the two properties the pod config must meet: compiled peak memory per chip <= 85 GB
(90% of a v5p chip's 95 GB) and compiled matmul FLOPs per chip within 1.3x of the model
accounting / chips (no duplicated expert or dense work). Needs the `aot` extra (libtpu); skips
with the install line otherwise. Slow: one TPU compile of a 2B model (5 min on one core of the
2-core host, 17 min when it was loaded).
"""

import importlib.util
import os

import pytest

from experiments.scale import aot

_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpu_hybrid_2b.py")


def test_topology_names():
    assert aot.topology_name("v5p-8") == "v5p:2x2x1"
    assert aot.topology_name("v5p-256") == "v5p:4x4x8"
    assert aot.topology_name("v5p:2x2x2") == "v5p:2x2x2"
    with pytest.raises(aot.AotError, match="v5p-N"):
        aot.topology_name("v4-8")
    with pytest.raises(aot.AotError, match="not a v5p slice"):
        aot.topology_name("v5p-6")


_NEEDS_LIBTPU = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu not importable: pip install '.[aot]' (libtpu==0.0.42.1) or "
           "PYTHONPATH=<libtpu install dir>")


@pytest.fixture(scope="module")
def hybrid_2b_v5p_8():
    spec = importlib.util.spec_from_file_location("gpu_hybrid_2b", _CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    with config.unlocked():
        config.rl.micro_batches = 2
        config.model.overrides.remat = "none"
    return aot.run(config, "v5p-8", rows=8, seq=4096, loss="cispo", mesh="fsdp=2,expert=2")


@pytest.mark.slow
@_NEEDS_LIBTPU
def test_hybrid_2b_update_step_fits_a_v5p_8(hybrid_2b_v5p_8):
    out = hybrid_2b_v5p_8
    assert out["fits"], out
    assert out["peak_bytes_per_chip"] <= 0.9 * aot.V5P_HBM_BYTES, out
    assert out["unknown_trip_loops"] == [], out
    assert "all-to-all" in out["collectives"], out


@pytest.mark.slow
@_NEEDS_LIBTPU
def test_hybrid_2b_compiled_flops_within_1_3x_of_model(hybrid_2b_v5p_8):
    """Measured 1.23x with the update step's expert-parallel capacity (1.25 x the mean load);
    1.40x with dropless worst-case receive buffers (ep x chunk x k rows)."""
    out = hybrid_2b_v5p_8
    ratio = out["flops_per_chip"] / out["model_flops_per_chip"]
    assert 1.0 <= ratio <= 1.3, out
