"""Compile for an NVIDIA GPU from a host without one: jax-cuda12-plugin's compile-only topology.

    pip install -e '.[gpu]'     # jax-cuda12-plugin / -pjrt pinned to the jax release, and
                                # nvidia-cuda-nvcc-cu12 (ptxas) to compile without a GPU
    python -m experiments.scale.aot --config=configs/gpu_hybrid_2b.py --topology=h200

The plugin builds devices from a target description (XLA's `GpuTargetConfigProto` in text
form: what the device query of a real GPU would return) instead of a driver, so XLA:GPU's
whole pipeline (fusion, cuBLAS / Triton choices, buffer assignment) runs as on the card; only
autotuning, which needs the card, falls back to XLA's defaults. `H200` below is written from
the H200 SXM's published figures (132 SMs of compute capability 9.0, 141 GB of HBM3e at
4.8 TB/s, 50 MB of L2, 228 KB of shared memory per SM).
"""

from __future__ import annotations

import dataclasses
import os

# A GPU's memory is whatever the allocator can get: the target's `device_memory_size` (what
# the driver reports, 141 GiB on an H200) is more than the 141 GB the fit is judged against.
_H200_SPEC = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 151397597184
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability {
    major: 9
    minor: 0
  }
}
platform_name: "CUDA"
dnn_version_info {
  major: 9
  minor: 8
}
device_description_str: "NVIDIA H200"
"""


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    name: str
    spec: str  # GpuTargetConfigProto text
    hbm_bytes: float  # the memory a program must fit (the card's nominal size)


TARGETS = {"h200": GpuTarget("NVIDIA H200", _H200_SPEC, 141e9)}


class GpuTargetError(Exception):
    """A one-line reason the GPU target could not be built (no plugin, ...)."""


def gpu_devices(name: str):
    """The compile-only devices (one GPU: topology 1x1x1) of target `name`."""
    if name not in TARGETS:
        raise GpuTargetError(f"unknown GPU target {name!r}; known: {sorted(TARGETS)}")
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        raise GpuTargetError("jax-cuda12-plugin is not importable: pip install '.[gpu]' "
                             "(pinned to the jax release)") from None
    _find_ptxas()
    import jax
    from jax.experimental import topologies
    try:
        topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=TARGETS[name].spec,
                                            topology="1x1x1")
    except Exception as e:  # a plugin that does not match this jax fails here
        raise GpuTargetError(f"jax-cuda12-plugin could not describe {name!r} with jax "
                             f"{jax.__version__}: {str(e).splitlines()[0]}") from None
    return topo.devices


def _find_ptxas() -> None:
    """XLA:GPU compiles PTX with ptxas: without a CUDA toolkit, the one that
    nvidia-cuda-nvcc-cu12 ships (put on PATH when it is not there already)."""
    try:
        import nvidia.cuda_nvcc
    except ImportError:
        return  # XLA then looks in the usual CUDA install places and says what it misses
    root = os.path.dirname(nvidia.cuda_nvcc.__file__) if nvidia.cuda_nvcc.__file__ else \
        list(nvidia.cuda_nvcc.__path__)[0]
    bin_dir = os.path.join(root, "bin")
    if os.path.isdir(bin_dir) and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
