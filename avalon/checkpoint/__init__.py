"""Checkpoints: Hugging Face import/export and orbax training state.

  hf             `load(path, mesh) -> (cfg, params)`, `save(path, cfg, params)`: Nemotron-H
                 safetensors checkpoints (hub and transformers layouts) <-> avalon params
  hf_config      config.json <-> ModelConfig
  hf_names       the one table: avalon leaf <-> HF tensor(s)
  safetensors_io reading tensor regions from / streaming tensors into safetensors files
  gguf           `GgufCheckpoint(path)`: a GGUF file (llama, qwen2, qwen3, qwen3moe) as an HF
                 checkpoint: `.hf_config()` (gguf_config) and `.tensors()` (SafetensorsDir's
                 reading interface, HF names, float32)
  avalon_format  `save_avalon` / `load_avalon`: params as an orbax checkpoint + ModelConfig JSON
  train_state    `TrainCheckpointer`: async, atomic, retained orbax training checkpoints
"""

from avalon.checkpoint import hf

__all__ = ["hf"]
