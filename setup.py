"""Avalon: reinforcement learning from collective rewards (RLCR), JAX-first."""

import setuptools

RUNTIME = [
    "jax>=0.10,<0.13",
    "flax",
    "optax",
    "orbax-checkpoint",
    "chex",
    "tensorstore",
    "numpy",
    "ml-collections",
    "absl-py",
    "tensorboard",  # event files (the writer only; no TensorFlow)
    "matplotlib",  # the end-of-run PNG plots
]

EXTRAS = {
    "test": ["pytest", "ruff"],
    # The Hugging Face oracle and checkpoint formats (parity tests, import/export).
    "hf": ["torch==2.13.0", "transformers==5.24.0", "safetensors", "tokenizers"],
    # Compile for TPU topologies from a CPU host (experiments/scale/aot.py): the libtpu release
    # that matches the jax release (jax 0.10.2 <-> libtpu 0.0.42.1).
    "aot": ["libtpu==0.0.42.1"],
}

setuptools.setup(
    name="avalon",
    version="0.1.0",
    description="RLCR: training one model to work as an organisation of copies of itself",
    packages=setuptools.find_packages(include=["avalon", "avalon.*"]),
    python_requires=">=3.10",
    install_requires=RUNTIME,
    extras_require=EXTRAS,
)
