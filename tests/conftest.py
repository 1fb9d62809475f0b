"""Every test runs on 8 fake CPU devices, so sharding is exercised in every run.

XLA's CPU compiler dominates the suite's time. Two remedies: LLVM optimisation level 0 (halves
the compile of a model gradient, ~25 s -> ~11 s on 2 cores, while the tiny programs run about as
fast), and the persistent compilation cache (keyed by the lowered program), which turns the
many tests that compile the same computation through different closures into cache loads.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("AVALON_TEST_JAX_CACHE",
                                 os.path.join(tempfile.gettempdir(), "avalon-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


import warnings  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_kernel():
    """The engine's CPU product kernel (`avalon/backends/cpu_gemm.py`), built and registered.
    `.ci/run` sets AVALON_REQUIRE_CPU_KERNEL=1, so in CI a kernel that does not build fails the
    tests that use this; elsewhere (no C++ compiler) they skip."""
    from avalon.backends import cpu_gemm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = cpu_gemm.ready()
    if not ok:
        if os.environ.get("AVALON_REQUIRE_CPU_KERNEL") == "1":
            pytest.fail("AVALON_REQUIRE_CPU_KERNEL=1 but the CPU kernel did not build")
        pytest.skip("the CPU kernel did not build here (no C++ compiler?)")
