"""Every test runs on 8 fake CPU devices, so sharding is exercised in every run."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
