"""Print a preset's parameter, FLOP and decode-byte accounting as JSON, without allocating.

    python -m avalon.tools.model_info --preset=nemotron3_super_120b_a12b
    python -m avalon.tools.model_info --preset=hybrid_2b_a06b --batch=256 --context=8192

Rules: `shared/reference/performance.md` ("Counting FLOPs and bytes honestly").
"""

from __future__ import annotations

import json

from absl import app, flags

from avalon.model import accounting, presets

_PRESET = flags.DEFINE_enum("preset", "tiny", presets.NAMES, "Model preset.")
_BATCH = flags.DEFINE_integer("batch", 1, "Decode slots (for decode bytes and roofline).")
_CONTEXT = flags.DEFINE_integer("context", 4096,
                                "Sequence length (training FLOPs) and decode context.")


def model_info(preset: str, batch: int, context: int) -> dict:
    if batch < 1:
        raise ValueError(f"--batch={batch}: must be at least 1")
    if context < 1:
        raise ValueError(f"--context={context}: must be at least 1")
    cfg = presets.get(preset)
    counts = accounting.param_counts(cfg)
    fwd = accounting.forward_flops_per_token(cfg, context)
    decode_bytes = accounting.decode_step_bytes(cfg, batch, context)
    return {
        "preset": preset,
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
    print(json.dumps(model_info(_PRESET.value, _BATCH.value, _CONTEXT.value), indent=2))


if __name__ == "__main__":  # one line for bad input and Ctrl-C (avalon/command.py)
    from avalon import command
    command.run("avalon.tools.model_info",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
