"""The Nemotron-H hybrid model (Mamba-2 / MoE / attention), pure-functional JAX.

Public API:
  presets.get(name) -> ModelConfig
  init_params(key, cfg) -> params
  forward(params, tokens, cfg, *, segment_ids=None, cache=None, routing=None) -> ForwardResult
  init_cache(cfg, batch, capacity) -> Cache
"""

from avalon.model import presets
from avalon.model.cache import Cache, init_cache
from avalon.model.config import AttentionImpl, ModelConfig, MoeBackend, Remat
from avalon.model.model import ForwardResult, forward, lm_logits, mtp_logits
from avalon.model.params import abstract_params, count_params, init_params, param_specs

__all__ = [
    "AttentionImpl", "Cache", "ForwardResult", "ModelConfig", "MoeBackend", "Remat",
    "abstract_params", "count_params", "forward", "init_cache", "init_params", "lm_logits",
    "mtp_logits", "param_specs", "presets",
]
