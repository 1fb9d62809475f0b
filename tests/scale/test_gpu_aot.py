"""Compile `configs/gpu_hybrid_2b.py` for one H200 from this CPU host (jax-cuda12-plugin's
compile-only topology, `experiments/scale/gpu_target.py`): the update step at the shape of the
loop's update calls and one decode dispatch at the pool's ceiling, each within 0.9 x 141 GB
(the decode beside the trainer's state, which stays on the card), the MoE backend resolved for
the GPU (not this host's CPU), and a decode whose temporaries do not grow with the KV pool (the
page writes update the one pool in place). Needs the `gpu` extra; skips with the install line
otherwise. Slow: three XLA:GPU compiles, ~1, 1 and 5 minutes on a free core."""

import importlib.util
import os

import pytest

from avalon.model.config import MoeBackend
from experiments.scale import aot

_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpu_hybrid_2b.py")
_LIMIT = 0.9 * 141e9



def _cuda_plugin_installed() -> bool:
    try:  # find_spec of a submodule imports its parent, which may be missing altogether
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:
        return False


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _cuda_plugin_installed(),
    reason="jax-cuda12-plugin not importable: pip install '.[gpu]'")]


def _config():
    spec = importlib.util.spec_from_file_location("gpu_hybrid_2b", _CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_h200_update_step_fits_at_the_loops_batch(monkeypatch):
    from avalon.backends import platform as backend_platform
    seen = []
    resolve = backend_platform.resolve_moe_backend
    monkeypatch.setattr(backend_platform, "resolve_moe_backend",
                        lambda b, platform: seen.append(platform) or resolve(b, platform))
    out = aot.run(_config(), "h200", rows=None, seq=None, loss="cispo")
    assert out["fits"], out
    assert (out["rows"], out["seq"]) == (64, 16384)  # rollout.max_update_rows x seq_len
    assert out["peak_bytes_per_chip"] <= _LIMIT, out
    assert seen and set(seen) <= {"gpu", "cuda"}, seen  # the mesh's platform, not the host's
    assert {resolve(MoeBackend.AUTO, p) for p in seen} == {MoeBackend.CAPACITY_BUCKETS}


def test_h200_decode_fits_beside_the_trainer_and_writes_one_kv_pool():
    at_ceiling = aot.run_decode(_config(), "h200")
    assert at_ceiling["fits"], at_ceiling
    assert at_ceiling["kv_pool_pages"] == 2 ** 19 and at_ceiling["slots"] == 1152
    assert at_ceiling["peak_with_trainer_state_bytes_per_chip"] <= _LIMIT, at_ceiling
    small = aot.run_decode(_config(), "h200", kv_tokens=16 * 16)
    # The pool is 34 GB; a copy of any one layer's K or V pool would add 4.3 GB here.
    one_layer_pool = at_ceiling["kv_pool_bytes"] / 8
    assert at_ceiling["kv_pool_bytes"] > 30e9
    assert at_ceiling["temp_bytes_per_chip"] - small["temp_bytes_per_chip"] < \
        0.01 * one_layer_pool, (at_ceiling["temp_bytes_per_chip"], small["temp_bytes_per_chip"])
