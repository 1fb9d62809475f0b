"""Print a model's parameter, FLOP and decode-byte accounting as JSON, without allocating.

    python -m avalon.tools.model_info --preset=nemotron3_super_120b_a12b
    python -m avalon.tools.model_info --preset=hybrid_2b_a06b --batch=256 --context=8192
    python -m avalon.tools.model_info --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf
    python -m avalon.tools.model_info --checkpoint=/ckpt/Qwen3-30B-A3B   # an HF directory

`--checkpoint` reads only the config (a directory's config.json, a GGUF file's metadata) and
names the Hugging Face model type it maps to (nemotron_h, llama, qwen2, qwen3, qwen3_moe).

Rules: `shared/reference/performance.md` ("Counting FLOPs and bytes honestly").
"""

from __future__ import annotations

import json

from absl import app, flags

from avalon.checkpoint import hf_config, hf_families
from avalon.model import accounting, presets
from avalon.model.config import ModelConfig

_PRESET = flags.DEFINE_enum("preset", "tiny", presets.NAMES, "Model preset.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "A Hugging Face directory or a GGUF file "
                                  "(its config only); overrides --preset.")
_BATCH = flags.DEFINE_integer("batch", 1, "Decode slots (for decode bytes and roofline).")
_CONTEXT = flags.DEFINE_integer("context", 4096,
                                "Sequence length (training FLOPs) and decode context.")


def checkpoint_config(path: str) -> ModelConfig:
    """The ModelConfig a checkpoint directory's config.json or a GGUF file describes."""
    import os

    from avalon.checkpoint import hf
    if os.path.isfile(path) and hf.is_gguf(path):
        from avalon.checkpoint.gguf import GgufCheckpoint, GgufError
        try:
            ck = GgufCheckpoint(path)
        except GgufError as e:
            raise ValueError(str(e)) from None
        return hf_config.from_hf(ck.hf_config(), source=path)
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"--checkpoint={path}: neither a GGUF file nor a directory with "
                         "config.json")
    return hf_config.from_hf(hf_config.read_json(config), source=config)


def model_info(preset: str, batch: int, context: int, checkpoint: str = "") -> dict:
    if batch < 1:
        raise ValueError(f"--batch={batch}: must be at least 1")
    if context < 1:
        raise ValueError(f"--context={context}: must be at least 1")
    cfg = checkpoint_config(checkpoint) if checkpoint else presets.get(preset)
    counts = accounting.param_counts(cfg)
    fwd = accounting.forward_flops_per_token(cfg, context)
    decode_bytes = accounting.decode_step_bytes(cfg, batch, context)
    return {
        **({"checkpoint": checkpoint} if checkpoint else {"preset": preset}),
        "hf_model_type": hf_families.family(cfg) or "nemotron_h",
        "pattern": cfg.pattern,
        "layers": {"mamba": cfg.count("M"), "moe": cfg.count("E"), "attention": cfg.count("*"),
                   "mlp": cfg.count("-")},
        "params": counts,
        "sequence_length": context,
        "forward_flops_per_token": fwd,
        "train_flops_per_token": 3 * fwd,
        "decode": {
            "batch": batch,
            "context": context,
            "step_flops": accounting.decode_step_flops(cfg, batch, context),
            "step_bytes": decode_bytes,
            "h200_roofline_s": accounting.decode_roofline_s(cfg, batch, context),
        },
    }


def main(argv):
    del argv
    print(json.dumps(model_info(_PRESET.value, _BATCH.value, _CONTEXT.value, _CHECKPOINT.value),
                     indent=2))


if __name__ == "__main__":  # one line for bad input and Ctrl-C (avalon/command.py)
    from avalon import command
    command.run("avalon.tools.model_info",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
