"""`train.program_maps`: compiled programs are dropped, and their JIT code's memory maps given
back, when the process nears the kernel's map limit; below it nothing is dropped."""

from __future__ import annotations

import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.train import program_maps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="memory maps are counted from Linux's /proc")


def _many_kernels(x, scale):
    # ~40 fusions and dots: ~120 maps of JIT code once compiled.
    for i in range(40):
        x = jnp.sin(x * (i + scale)) @ x.T if i % 2 else jnp.tanh(x + i) * jnp.cos(x)
    return x


def _compiled():
    """Two freshly compiled programs: `kept` (the run's other programs) and `engine`."""
    kept = jax.jit(lambda x: _many_kernels(x, 1.0))
    engine = jax.jit(lambda x: _many_kernels(x, 2.0))
    x = jnp.ones((16, 16), jnp.float32) * 0.1
    return kept, engine, x, np.asarray(kept(x)), np.asarray(engine(x))


def test_counts_the_jit_codes_maps_and_reads_the_limit(tmp_path):
    before = program_maps.count_maps()
    _compiled()
    assert program_maps.count_maps() >= before + 100  # two programs' code, ~120 maps each
    (tmp_path / "limit").write_text("65530\n")
    assert program_maps.map_limit(str(tmp_path / "limit")) == 65530
    (tmp_path / "bad").write_text("lots\n")
    assert program_maps.map_limit(str(tmp_path / "bad")) is None
    assert program_maps.map_limit(str(tmp_path / "missing")) is None
    assert program_maps.release_near_limit(lambda: None,
                                           maps_file=str(tmp_path / "missing")) == {}


def test_below_the_limit_nothing_is_dropped():
    kept, engine, x, _, _ = _compiled()
    calls = []
    maps = program_maps.count_maps()
    out = program_maps.release_near_limit(lambda: calls.append(1), limit=10 * maps)
    assert set(out) == {"host/memory_maps"} and not calls
    assert kept._cache_size() == 1 and engine._cache_size() == 1


@pytest.mark.parametrize("past_by, level, says", [
    (40, 1, "engine's compiled programs"),  # dropping the engine's program (~120 maps) is enough
    (400, 2, "every compiled program"),  # still past the threshold without the engine's
])
def test_past_the_threshold_programs_are_dropped_engine_first(past_by, level, says):
    kept, engine, x, want_kept, want_engine = _compiled()
    maps = program_maps.count_maps()
    limit = int((maps - past_by) / program_maps.RELEASE_AT)
    stream = io.StringIO()
    out = program_maps.release_near_limit(engine.clear_cache, limit=limit, stream=stream)
    assert out["host/programs_released"] == level
    freed = out["host/memory_maps_before_release"] - out["host/memory_maps"]
    assert freed >= (100 if level == 1 else 200)
    assert engine._cache_size() == 0 and kept._cache_size() == (1 if level == 1 else 0)
    assert says in stream.getvalue() and f"{limit:,}" in stream.getvalue()
    assert "vm.max_map_count" in stream.getvalue()
    # They compile again and compute the same.
    np.testing.assert_array_equal(np.asarray(engine(x)), want_engine)
    np.testing.assert_array_equal(np.asarray(kept(x)), want_kept)
