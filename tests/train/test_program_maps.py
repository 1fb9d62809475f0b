"""`train.program_maps`: the process's memory maps are counted (compiled JIT code adds them,
dropping the programs gives them back), and past the threshold compiled programs are dropped,
the engine's first; below it nothing is."""

from __future__ import annotations

import gc
import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon.train import program_maps

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="memory maps are counted from Linux's /proc")


def _many_kernels(x, scale):
    # ~40 fusions and dots: ~120 maps of JIT code once compiled.
    for i in range(40):
        x = jnp.sin(x * (i + scale)) @ x.T if i % 2 else jnp.tanh(x + i) * jnp.cos(x)
    return x


def _program(scale: float):
    return jax.jit(lambda x: _many_kernels(x, scale))


X = jnp.ones((16, 16), jnp.float32) * 0.1


@linux_only
def test_compiled_code_adds_maps_and_dropping_it_gives_them_back():
    # Ten programs, not one: the kernel merges adjacent maps of one kind, so a single small
    # program may add none; ten add ~1,200 in a fresh process.
    programs = [_program(s) for s in range(100, 110)]
    before = program_maps.count_maps()
    for p in programs:
        p(X).block_until_ready()
    compiled = program_maps.count_maps()
    for p in programs:
        p.clear_cache()
    gc.collect()
    dropped = program_maps.count_maps()
    assert compiled >= before + 300, (before, compiled)
    assert dropped <= compiled - 300, (compiled, dropped)


def test_reads_the_limit(tmp_path):
    (tmp_path / "limit").write_text("65530\n")
    assert program_maps.map_limit(str(tmp_path / "limit")) == 65530
    (tmp_path / "bad").write_text("lots\n")
    assert program_maps.map_limit(str(tmp_path / "bad")) is None
    assert program_maps.map_limit(str(tmp_path / "missing")) is None
    assert program_maps.count_maps(str(tmp_path / "missing")) is None
    assert program_maps.release_near_limit(lambda: None, limit=100, count=lambda: None) == {}


class _Process:
    """A process's map count as the release steps leave it: `maps`, less what the engine's
    release frees, less the rest when every program is dropped (jax.clear_caches, watched
    through a compiled program's cache)."""

    def __init__(self, maps: int, engine_frees: int, rest_frees: int):
        self.maps, self.engine_frees, self.rest_frees = maps, engine_frees, rest_frees
        self.kept, self.engine = _program(1.0), _program(2.0)
        self.want_kept, self.want_engine = np.asarray(self.kept(X)), np.asarray(self.engine(X))
        self.engine_releases = 0

    def release_engine(self):
        self.engine_releases += 1
        self.engine.clear_cache()

    def count(self) -> int:
        n = self.maps
        if self.engine_releases:
            n -= self.engine_frees
        if self.kept._cache_size() == 0:  # jax.clear_caches ran
            n -= self.rest_frees
        return n


def test_below_the_threshold_nothing_is_dropped():
    proc = _Process(maps=6_999, engine_frees=500, rest_frees=5_000)
    out = program_maps.release_near_limit(proc.release_engine, limit=10_000, count=proc.count)
    assert out == {"host/memory_maps": 6_999}
    assert proc.engine_releases == 0 and proc.kept._cache_size() == 1


@pytest.mark.parametrize("engine_frees, level, says, after", [
    (1_500, 1, "the engine's compiled programs", 6_500),  # under 7,000: enough
    (500, 2, "every compiled program", 2_500),  # 7,500 is not: every program goes
])
def test_past_the_threshold_programs_are_dropped_engine_first(engine_frees, level, says, after):
    proc = _Process(maps=8_000, engine_frees=engine_frees, rest_frees=5_000)
    stream = io.StringIO()
    out = program_maps.release_near_limit(proc.release_engine, limit=10_000, count=proc.count,
                                          stream=stream)
    assert out == {"host/memory_maps": after, "host/memory_maps_before_release": 8_000,
                   "host/programs_released": level}
    assert proc.engine_releases == 1 and proc.engine._cache_size() == 0
    assert proc.kept._cache_size() == (1 if level == 1 else 0)
    text = stream.getvalue()
    assert says in text and "8,000" in text and "10,000" in text and f"{after:,}" in text
    # Dropped programs compile again and compute the same.
    np.testing.assert_array_equal(np.asarray(proc.engine(X)), proc.want_engine)
    np.testing.assert_array_equal(np.asarray(proc.kept(X)), proc.want_kept)
