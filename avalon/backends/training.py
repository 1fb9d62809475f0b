"""What the update step compiles with on each platform (`rl/update.py` asks `compiler_options`).

XLA:CPU compiles the update step's programs with YNNPACK for single dots only: reductions and
elementwise passes run on XLA's own emitters. YNNPACK's reduce fusions (norms, softmax, the
SSD's dt gradient) were the slower ones here (issue 22: without any YNNPACK fusion the vs_torch
update step took 12% less CPU time); its single dots are faster than Eigen's once the LM head's
weight gradient is an untransposed product (`model.dense.dense_head`): 1.05x / 1.08x on the
step, medians of 5 / 7 alternating pairs (experiments/bench/RESULTS.md). Other platforms
compile with their defaults.
"""

from __future__ import annotations

from jax.sharding import Mesh

from avalon import sharding

CPU_COMPILER_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(mesh: Mesh | None) -> dict | None:
    """The XLA options the update step's jits compile with on this mesh's platform (no mesh:
    the default backend's)."""
    return dict(CPU_COMPILER_OPTIONS) if sharding.platform(mesh) == "cpu" else None
