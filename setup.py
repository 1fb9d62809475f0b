"""Avalon: reinforcement learning from collective rewards (RLCR), JAX-first."""

import setuptools

RUNTIME = [
    "jax>=0.10,<0.13",
    "flax",
    "optax",
    "orbax-checkpoint",
    "etils[epath]",  # avalon/paths.py: every path a run writes (gs:// URLs stay URLs)
    "chex",
    "tensorstore",
    "numpy",
    "ml-collections",
    "absl-py",
    "tensorboard",  # event files (the writer only; no TensorFlow)
    "matplotlib",  # the end-of-run PNG plots
]

EXTRAS = {
    # nbclient, nbformat and ipykernel execute the notebook (tests/experiments/test_notebook.py).
    # gcsfs and gcp-storage-emulator (a loopback GCS server) run a gs:// workdir end to end
    # (tests/train/test_remote_workdir.py). hypothesis generates the tool arguments of the
    # security fuzz (tests/security/test_tool_fuzz.py). import-linter checks the layers of
    # docs/architecture.md (`lint-imports`, .importlinter). pytest-xdist runs the suite on
    # every core (`python -m pytest -n 2`). openai: the server's tests drive it with the real
    # client (tests/serving/).
    "test": ["pytest", "pytest-xdist", "ruff", "nbclient", "nbformat", "ipykernel", "gcsfs",
             "gcp-storage-emulator", "hypothesis", "import-linter", "openai>=2.54,<3"],
    # A gs:// workdir (pod runs): etils.epath and TensorBoard reach GCS through gcsfs.
    "gcs": ["gcsfs"],
    # The Hugging Face oracle and checkpoint formats (parity tests, import/export); jinja2
    # renders a checkpoint's chat template (avalon/tokenizer/template.py); gguf reads GGUF files
    # (avalon/checkpoint/gguf.py), and transformers needs accelerate to load one.
    "hf": ["torch==2.13.0", "transformers==5.24.0", "safetensors", "tokenizers", "jinja2",
           "gguf", "accelerate"],
    # The llama.cpp peer of experiments/bench/vs_llamacpp.py (its C API through ctypes; pip
    # builds llama.cpp from source, minutes); with the hf extra's gguf.
    "bench": ["llama-cpp-python==0.3.36", "gguf"],
    # The OpenAI-compatible server's client (`python -m avalon.serve`; its tests drive the
    # server with the real `openai` client), inspect-ai for the safety suite as an inspect task
    # (experiments/safety/inspect_task.py), verifiers for its v1 tasksets in Avalon's loop
    # (avalon/envs/verifiers_env.py). inspect-ai 0.3.258 is the newest whose openai provider
    # takes the openai 2 line verifiers 0.4 needs (0.3.259 on want openai 3). It pins fsspec
    # below gcsfs's, and verifiers' mcp wants an sse-starlette above openreward's pin: .ci/run
    # puts the test extra's versions back after installing these two (see there).
    "serve": ["openai>=2.54,<3"],
    "inspect": ["inspect-ai==0.3.258", "openai>=2.54,<3"],
    "verifiers": ["verifiers==0.4.0"],
    # The Open Reward Standard's SDK: only the ORS tests use it (a reference server and
    # client); OrsEnvironment and the ORS server are stdlib.
    "ors": ["openreward>=0.1.160,<0.2"],
    # OpenSpiel's games as environments (avalon/envs/openspiel/, configs/openspiel.py, the
    # social dilemmas' co-operation measurement); its manylinux wheels include Hanabi.
    "games": ["open_spiel==2.0.2"],
    # The update step's fp32 products on Intel MKL on an x86-64 CPU (avalon/backends/cpu_blas.py:
    # 1.1-1.6x XLA:CPU's products at SmolLM2's shapes; without it XLA's are used). The wheel
    # holds MKL's single dynamic library, found under the environment's lib/.
    "cpu": ["mkl; platform_machine == 'x86_64' or platform_machine == 'AMD64'"],
    # Compile for TPU topologies from a CPU host (experiments/scale/aot.py): the libtpu release
    # that matches the jax release (jax 0.10.2 <-> libtpu 0.0.42.1).
    "aot": ["libtpu==0.0.42.1"],
    # A TPU pod worker (launch/worker_setup.sh): the jax release with its libtpu, a gs://
    # workdir, and what a Hugging Face checkpoint's tokenizer and chat template need.
    "pod": ["jax[tpu]==0.10.2", "libtpu==0.0.42.1", "gcsfs", "jinja2", "safetensors",
            "tokenizers"],
    # NVIDIA GPUs (README "One GPU"): the CUDA 12 plugin of the jax release with its CUDA
    # libraries, and ptxas (nvidia-cuda-nvcc-cu12), which also lets a host without a GPU
    # compile for one (experiments/scale/aot.py --topology=h200).
    "gpu": ["jax==0.10.2", "jax-cuda12-plugin[with-cuda]==0.10.2", "jax-cuda12-pjrt==0.10.2",
            "nvidia-cuda-nvcc-cu12"],
}

setuptools.setup(
    name="avalon",
    version="0.1.0",
    description="RLCR: training one model to work as an organisation of copies of itself",
    packages=setuptools.find_packages(include=["avalon", "avalon.*"]),
    # The CPU kernels (the engine's products, the update step's attention) and their shared
    # header, compiled on the user's machine at first use (avalon/backends/cpu_build.py).
    package_data={"avalon": ["backends/*.cc", "backends/*.h", "data/toy_smoke_seed/*",
                            "train/eta_reference/*.jsonl"]},
    python_requires=">=3.11",  # the pinned jax needs 3.11
    install_requires=RUNTIME,
    extras_require=EXTRAS,
)
