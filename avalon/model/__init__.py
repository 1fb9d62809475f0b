"""The Nemotron-H hybrid model (Mamba-2 / MoE / attention), pure-functional JAX.

Public API:
  presets.get(name) -> ModelConfig
  init_params(key, cfg) -> params
  forward(params, tokens, cfg, *, segment_ids=None, cache=None, routing=None, ops=PLAIN)
      -> ForwardResult
  init_cache(cfg, batch, capacity) -> Cache
  param_shardings(cfg, mesh, rules) -> a NamedSharding per param leaf

The math is written once, in plain JAX, and never asks which platform it runs on; each
platform's fast paths (decode weight layouts, kernels, the CPU's product and gather tactics)
live in `avalon/backends/`, which this package never imports, and reach the model as one
argument (`ops.Ops`). The recipe it serves: docs/recipe.md; the layers: docs/architecture.md.

Notation (array shapes in docstrings, comments and einsum subscripts):
  b batch rows            t, s positions in a row      n flat tokens (b * t)
  d, D model width        v, V vocabulary              L layers of the pattern
  h, nh query heads       nkv key/value heads          hd head_dim; g = nh / nkv
  H Mamba heads           P Mamba head dim             G groups; N state size; K conv kernel
  e, E routed experts     k experts per token          f, F feed-forward width (expert, MLP)
  w expert input width (the latent width when moe_latent_size is set, else D)
  m MoE layers (routing arrays [m, b, t, k])           c a chunk of positions
Logical axis names (what `avalon/sharding.py`'s rules tables map to mesh axes) are listed in
`params.py`; weights are stored [in, out], heads explicit ([D, heads, head_dim]).
"""

from avalon.model import presets
from avalon.model.cache import Cache, init_cache
from avalon.model.config import AttentionImpl, ModelConfig, MoeBackend, Remat
from avalon.model.model import ForwardResult, forward, lm_logits, mtp_logits
from avalon.model.ops import PLAIN, Ops
from avalon.model.params import (
    abstract_params,
    count_params,
    init_params,
    param_shardings,
    param_specs,
)

__all__ = [
    "PLAIN", "AttentionImpl", "Cache", "ForwardResult", "ModelConfig", "MoeBackend", "Ops",
    "Remat",
    "abstract_params", "count_params", "forward", "init_cache", "init_params", "lm_logits",
    "mtp_logits", "param_shardings", "param_specs", "presets",
]
