"""Throughput and MFU of the update step (SFT or CISPO) on one device.

    python -m experiments.bench.train_step --preset=tiny --seq=256 --batch=8 --loss=cispo
    python -m experiments.bench.train_step --preset=hybrid_2b_a06b --seq=4096 --batch=8 \
        --loss=sft --rows=full --remat=dots          # one H200 (target: >= 35% MFU)

Builds one batch of random tokens, places it on the device once, then times `--steps` calls of
the jitted, donated update step after `--warmup` calls (compilation excluded and reported
apart), blocking once at the end. Prints one JSON object.

Rows. `--rows=full`: every sequence is one row of `--seq` tokens (the plain training step).
`--rows=mix`: rows of log-normal lengths (median seq/5, clipped to [32, seq]) packed into
`--batch` sequences by `avalon.rl.packing` (an RL batch of agent contexts); `fill` is the share
of non-padding positions. Half of each row's tokens carry loss. CISPO batches replay random,
balanced routing (every MoE layer, k distinct experts per token) and random sampler log-probs.

Accounting (performance.md, "Counting FLOPs and bytes honestly"): model FLOPs are
`train_flops_per_token(cfg, L)` (3 x the forward matmul FLOPs, active experts only, no remat,
no padding) summed over every real token, with L the length of the row the token is in (so a
short packed row is charged short-row attention). `tokens_per_s` counts every real token that
went through the model, `loss_tokens_per_s` only those carrying loss. MFU is against the
H200's datasheet 989 TFLOP/s and its measured 801 TFLOP/s (meaningless on CPU; reported anyway).
Params are kept in fp32 (master weights: an lr-4e-6 AdamW step is below bf16 resolution);
compute runs in the preset's dtype (bf16 for the benchmark presets).
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from absl import app, flags

from avalon.model import AttentionImpl, MoeBackend, Remat, init_params, presets
from avalon.model.accounting import H200_MEASURED_FLOPS, H200_PEAK_FLOPS, train_flops_per_token
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.packing import PackRow, pack_rows
from avalon.rl.update import make_update_step

_PRESET = flags.DEFINE_enum("preset", "tiny", presets.NAMES, "Model preset.")
_SEQ = flags.DEFINE_integer("seq", 256, "Packed sequence length.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per update step.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after the first (compiling) one.")
_LOSS = flags.DEFINE_enum("loss", "cispo", ["sft", "cispo"], "Loss of the update step.")
_ROWS = flags.DEFINE_enum("rows", None, ["full", "mix"],
                          "Row lengths: full sequences or a packed mix (default: full for sft, "
                          "mix for cispo).")
_MICRO = flags.DEFINE_integer("micro_batches", 1, "Gradient accumulation steps.")
_CHUNK = flags.DEFINE_integer("logprob_chunk", 512, "LM-head positions per chunk.")
_REMAT = flags.DEFINE_enum("remat", None, [r.value for r in Remat],
                           "Override the preset's remat policy.")
_MOE = flags.DEFINE_enum("moe_backend", None, [b.value for b in MoeBackend],
                         "Override the preset's MoE dispatch backend.")
_ATTN = flags.DEFINE_enum("attention_impl", None, [a.value for a in AttentionImpl],
                          "Override the preset's full-sequence attention kernel.")
_SEED = flags.DEFINE_integer("seed", 0, "Data seed.")


def _row_lengths(rng, rows: str, seq: int, batch: int) -> list[int]:
    if rows == "full":
        return [seq] * batch
    lengths, total = [], 0
    # Draw until the rows would fill ~95% of the batch; the packer reports the real fill.
    while total < 0.95 * seq * batch:
        n = int(np.clip(rng.lognormal(np.log(seq / 5), 0.9), 32, seq))
        lengths.append(n)
        total += n
    return lengths


def make_batch(cfg, loss: LossKind, rows: str, seq: int, batch: int, seed: int):
    """A packed host batch of random rows and the lengths of the rows it holds."""
    rng = np.random.default_rng(seed)
    routing_shape = None
    if loss == LossKind.CISPO and cfg.count("E"):
        routing_shape = (cfg.count("E"), cfg.num_experts_per_tok)
    lengths = _row_lengths(rng, rows, seq, batch)
    packed = []
    for n in lengths:
        mask = rng.random(n) < 0.5
        routing = None
        if routing_shape is not None:
            # k distinct experts per token: the first k of a random permutation.
            keys = rng.random((n, routing_shape[0], cfg.n_routed_experts))
            routing = np.argsort(keys, axis=-1)[..., :routing_shape[1]].astype(np.int32)
        packed.append(PackRow(
            tokens=rng.integers(0, cfg.vocab_size, n).astype(np.int32), loss_mask=mask,
            old_logp=np.where(mask, -rng.exponential(2.0, n), 0.0).astype(np.float32),
            advantages=np.where(mask, rng.normal(size=n), 0.0).astype(np.float32),
            routing=routing))
    host, stats = pack_rows(packed, seq, routing_shape=routing_shape)
    if stats.sequences > batch:  # the mix overflowed: drop the rows of the extra sequences
        host = host.replace(**{f: None if getattr(host, f) is None else getattr(host, f)[:batch]
                               for f in ("tokens", "targets", "segment_ids", "loss_mask",
                                         "old_logp", "advantages", "routing")})
    elif stats.sequences < batch:
        host, stats = pack_rows(packed, seq, routing_shape=routing_shape, min_seqs=batch)
    # Lengths of the rows actually present (for FLOPs): segment sizes per sequence.
    seg = host.segment_ids
    kept = [int((seg[b] == s).sum()) for b in range(seg.shape[0])
            for s in range(1, int(seg[b].max()) + 1)]
    return host, kept


def run(preset: str, seq: int, batch: int, steps: int, warmup: int, loss: str, rows: str | None,
        micro_batches: int, logprob_chunk: int, remat: str | None, moe_backend: str | None,
        attention_impl: str | None, seed: int) -> dict:
    overrides = {"param_dtype": "float32"}
    if remat is not None:
        overrides["remat"] = Remat(remat)
    if moe_backend is not None:
        overrides["moe_backend"] = MoeBackend(moe_backend)
    if attention_impl is not None:
        overrides["attention_impl"] = AttentionImpl(attention_impl)
    cfg = presets.get(preset, **overrides)
    kind = LossKind(loss)
    rows = rows or ("full" if kind == LossKind.SFT else "mix")
    rl_cfg = RLConfig(loss=kind, micro_batches=micro_batches, logprob_chunk=logprob_chunk)
    host, lengths = make_batch(cfg, kind, rows, seq, batch, seed)
    step = make_update_step(cfg, rl_cfg)
    device_batch = step.put_batch(host)
    state = step.init_state(init_params(jax.random.key(seed), cfg))

    start = time.perf_counter()
    state, metrics = step.step_fn(state, device_batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        state, metrics = step.step_fn(state, device_batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step.step_fn(state, device_batch)
    jax.block_until_ready((state, metrics))
    step_s = (time.perf_counter() - start) / steps

    tokens = int(sum(lengths))
    loss_tokens = int(host.loss_mask.sum())
    flops = float(sum(n * train_flops_per_token(cfg, n) for n in lengths))
    achieved = flops / step_s
    return {
        "preset": preset, "loss": loss, "rows": rows, "seq": seq, "batch": batch,
        "micro_batches": micro_batches, "dtype": cfg.dtype, "remat": cfg.remat.value,
        "moe_backend": cfg.moe_backend.value, "attention_impl": cfg.attention_impl.value,
        "device": jax.devices()[0].device_kind,
        "compile_s": round(compile_s, 2), "step_s": step_s,
        "fill": tokens / (batch * seq),
        "tokens_per_s": tokens / step_s, "loss_tokens_per_s": loss_tokens / step_s,
        "train_flops_per_token_at_seq": train_flops_per_token(cfg, seq),
        "model_tflops_per_s": achieved / 1e12,
        "mfu_vs_989": achieved / H200_PEAK_FLOPS, "mfu_vs_801": achieved / H200_MEASURED_FLOPS,
        "last_loss": float(metrics["loss"]), "skipped": int(metrics["skipped"]),
    }


def main(argv):
    del argv
    result = run(_PRESET.value, _SEQ.value, _BATCH.value, _STEPS.value, _WARMUP.value,
                 _LOSS.value, _ROWS.value, _MICRO.value, _CHUNK.value, _REMAT.value, _MOE.value,
                 _ATTN.value, _SEED.value)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    app.run(main)
