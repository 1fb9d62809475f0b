"""Every test runs on 8 fake CPU devices, so sharding is exercised in every run.

XLA's CPU compiler dominates the suite's time. Two remedies: LLVM optimisation level 0 (halves
the compile of a model gradient, ~25 s -> ~11 s on 2 cores, while the tiny programs run about as
fast), and the persistent compilation cache (keyed by the lowered program), which turns the
many tests that compile the same computation through different closures into cache loads.
The default suite runs as `python -m pytest -n 2` (pytest-xdist, a test file to a worker): both
workers and the `avalon.main` processes tests start share the one cache. JAX writes an entry in
place, so a process may read an entry another is still writing; it then warns and compiles the
program itself (avalon's commands ignore warnings unless `--verbose`).
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Once: pytest-xdist's workers inherit the flags their parent set, and a repeated flag is another
# XLA_FLAGS string, so another key for every program in the compilation cache.
if "--xla_backend_optimization_level=0" not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

# Runs the tests start record their unit times here, not in the machine's record of real runs
# (`avalon/train/eta.py`), whose forecasts they would skew.
os.environ.setdefault("AVALON_TIMINGS_DIR",
                      os.path.join(tempfile.gettempdir(), "avalon-test-timings"))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("AVALON_TEST_JAX_CACHE",
                                 os.path.join(tempfile.gettempdir(), "avalon-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


import gc  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402


def _require_kernel(ready, what: str) -> None:
    """Build and register a CPU kernel (`ready()`); fail in CI (AVALON_REQUIRE_CPU_KERNEL=1) if
    it does not build, skip elsewhere."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = ready()
    if not ok:
        if os.environ.get("AVALON_REQUIRE_CPU_KERNEL") == "1":
            pytest.fail(f"AVALON_REQUIRE_CPU_KERNEL=1 but the CPU {what} kernel did not build")
        pytest.skip(f"the CPU {what} kernel did not build here (no C++ compiler?)")


@pytest.fixture(scope="session")
def cpu_attention_kernel():
    """The update step's CPU attention kernel (`avalon/backends/cpu_attention.py`), registered
    as `Ops.attention` on a one-device CPU."""
    from avalon.backends import cpu_attention

    _require_kernel(cpu_attention.ready, "attention")


@pytest.fixture(scope="session")
def cpu_log_softmax_kernel():
    """The update step's CPU log-prob kernel (`avalon/backends/cpu_log_softmax.py`)."""
    from avalon.backends import cpu_log_softmax

    _require_kernel(cpu_log_softmax.ready, "log-prob")


@pytest.fixture(scope="session")
def cpu_optimizer_kernel():
    """The update step's CPU optimizer kernel (`avalon/backends/cpu_optimizer.py`)."""
    from avalon.backends import cpu_optimizer

    _require_kernel(cpu_optimizer.ready, "optimizer")


@pytest.fixture(scope="session")
def cpu_layer_kernels():
    """The update step's CPU RMSNorm and SwiGLU kernels (`avalon/backends/cpu_rms_norm.py`,
    `cpu_swiglu.py`)."""
    from avalon.backends import cpu_rms_norm, cpu_swiglu

    _require_kernel(cpu_rms_norm.ready, "RMSNorm")
    _require_kernel(cpu_swiglu.ready, "SwiGLU")


@pytest.fixture(scope="session")
def cpu_blas_kernel():
    """The update step's products on MKL (`avalon/backends/cpu_blas.py`, the `cpu` extra): skip
    where MKL is not installed (an optional library), fail in CI (AVALON_REQUIRE_CPU_KERNEL=1,
    which installs it) if it is missing or the kernel does not build."""
    from avalon.backends import cpu_blas

    if cpu_blas.find_library() is None and os.environ.get("AVALON_REQUIRE_CPU_KERNEL") != "1":
        pytest.skip("MKL is not installed here (pip install -e '.[cpu]')")
    _require_kernel(cpu_blas.ready, "BLAS")


@pytest.fixture(scope="session")
def cpu_kernel():
    """The engine's CPU product kernel (`avalon/backends/cpu_gemm.py`), built and registered.
    `.ci/run` sets AVALON_REQUIRE_CPU_KERNEL=1, so in CI a kernel that does not build fails the
    tests that use this; elsewhere (no C++ compiler) they skip."""
    from avalon.backends import cpu_gemm

    _require_kernel(cpu_gemm.ready, "product")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test file, drop JAX's in-memory caches of compiled programs. XLA:CPU maps each
    program's code in many small regions (one engine test left 2-7 thousand), and a worker that
    kept every program of its ~700 tests passed Linux's 65,530 maps a process (vm.max_map_count)
    and died of a segfault in whichever allocation came next. Later files load what they share
    from the persistent compilation cache."""
    yield
    jax.clear_caches()
    gc.collect()
