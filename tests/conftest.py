"""Every test runs on 8 fake CPU devices, so sharding is exercised in every run.

XLA's CPU compiler dominates the suite's time, and many tests compile the same computation
through different Python closures; the persistent compilation cache (keyed by the lowered
program) turns those repeats into cache loads.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("AVALON_TEST_JAX_CACHE",
                                 os.path.join(tempfile.gettempdir(), "avalon-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
