"""The update step: one jitted function from (train state, packed batch) to the next state.

    forward (routing replay, frozen router, TRAIN_RULES) → chunked token log-probs → loss
    (CISPO or SFT, token-normalised over the whole batch) → gradients, accumulated over
    micro-batches by `lax.scan` → global-norm clip → AdamW (constant lr) → new params

The platform's choices arrive as one `backends.training.TrainingPlatform` (built from the mesh
when none is given): the model's ops, a log-probs kernel, the optimizer's fused pass, the
compiler's options and whether a micro-batch's logits are kept for the backward. On a CPU with
one device its kernels take the attention, the log-probs' reductions, the products (with MKL),
the norms and SwiGLU, and the clip + AdamW + guard as one pass per parameter on optax's state;
each equals this module's own path to rounding (tests/backends/).

The router weight and correction bias are frozen twice: the model config used for training has
`router_frozen=True` (no gradient reaches them) and the optimizer labels them `set_to_zero`, so
weight decay cannot touch them either; their arrays are passed through unchanged (bit-identical).
A non-finite gradient norm or loss skips the update: params and optimizer state are returned
unchanged and `skipped` = 1 is reported. So does a batch without loss tokens (every group
dropped for zero variance: a result the policy can cause), where AdamW would otherwise still
apply momentum and weight decay. The state is donated; with a mesh, every input and
output has a declared sharding (params per TRAIN_RULES, batch over data × fsdp × expert).

Metrics (scalars): loss, loss_tokens, tokens (real, non-padding), entropy (mean over loss
tokens), grad_norm (before clipping), skipped, empty_micro_batches (micro-batches without a
loss token, which the scan does not run: padding rows cost nothing); CISPO adds ratio_mean/
max/min, clipped_frac (clipped_high_frac, clipped_low_frac) and token_adv_mean/std/min/max;
SFT adds nll.

Micro-batch j takes sequences j, j + n, j + 2n, ... of the batch (an interleaved split), so with
the batch sharded over data × fsdp every device holds its share of every micro-batch and the
split moves no data.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from avalon import model as M
from avalon.backends.training import TrainingPlatform
from avalon.model import config as model_config
from avalon.model.config import ModelConfig
from avalon.rl.batch import TrainBatch, routing_dtype
from avalon.rl.config import LossKind, RLConfig
from avalon.rl.logprobs import sequence_logprobs
from avalon.rl.losses import REDUCTIONS, Reduce, cispo_loss, combine_metrics, sft_loss
from avalon.sharding import TRAIN_RULES, TRAIN_SEQ_RULES, batch_axes, seq_axes, use_rules

FROZEN_LEAVES = ("router", "router_bias")

@struct.dataclass
class TrainState:
    step: jax.Array  # int32 []: updates applied (skipped ones are not counted)
    params: dict
    opt_state: Any


def is_frozen(path, rl_cfg: RLConfig) -> bool:
    """True for the MoE router weight and correction bias when `freeze_router` is set."""
    last = path[-1]
    return (rl_cfg.freeze_router and isinstance(last, jax.tree_util.DictKey)
            and last.key in FROZEN_LEAVES)


def frozen_mask(params, rl_cfg: RLConfig):
    """A bool per leaf of `params` (arrays or abstract): True where the optimizer never writes."""
    return jax.tree_util.tree_map_with_path(lambda p, _: is_frozen(p, rl_cfg), params)


def make_optimizer(rl_cfg: RLConfig) -> optax.GradientTransformation:
    """Global-norm clip + AdamW at a constant lr on trainable leaves; frozen leaves get zero
    updates and keep no optimizer state."""
    parts = [optax.clip_by_global_norm(rl_cfg.clip_norm)] if rl_cfg.clip_norm > 0 else []
    parts.append(optax.adamw(rl_cfg.lr, b1=rl_cfg.b1, b2=rl_cfg.b2, eps=rl_cfg.adam_eps,
                             weight_decay=rl_cfg.weight_decay))
    train = optax.chain(*parts)

    def labels(params):
        return jax.tree.map(lambda f: "frozen" if f else "train", frozen_mask(params, rl_cfg))

    return optax.multi_transform({"train": train, "frozen": optax.set_to_zero()}, labels)


def training_model_config(model_cfg: ModelConfig, rl_cfg: RLConfig) -> ModelConfig:
    """The model config the update step runs: router frozen when `rl_cfg.freeze_router`, the
    expert-parallel capacity `rl_cfg.moe_capacity_factor`."""
    if model_cfg.param_dtype not in ("float32", "float64"):
        model_config.CHECK.fail(
            "param_dtype", model_cfg.param_dtype, "the update step keeps the params it trains, "
            "and an AdamW step of lr ~4e-6 is below bfloat16/float16 resolution (it would round "
            "to no change); train with param_dtype='float32' and dtype='bfloat16' (fp32 master "
            "weights, bf16 compute)")
    return model_cfg.replace(router_frozen=model_cfg.router_frozen or rl_cfg.freeze_router,
                             moe_capacity_factor=rl_cfg.moe_capacity_factor)


@dataclasses.dataclass(frozen=True)
class UpdateStep:
    """The jitted step and the shardings it declares. Build with `make_update_step`."""

    model_cfg: ModelConfig  # the training config (router frozen)
    rl_cfg: RLConfig
    mesh: Mesh | None
    optimizer: optax.GradientTransformation
    step_fn: Any  # jitted (state, batch) -> (state, metrics); donates state
    logprob_fn: Any  # jitted (params, batch) -> (logp [B, S], entropy [B, S])
    state_shardings: Any  # TrainState of NamedSharding, or None without a mesh
    batch_sharding: Any  # one NamedSharding for every batch leaf, or None
    grad_norm_fn: Any  # jitted (params, batch, keep [B, S] bool) -> |grad| of keep's terms
    # One AdamW step over several calls (`accumulated`): zeros_fn(params) -> acc;
    # accumulate_fn(params, acc, batch, num_tokens) -> (acc, part metrics), acc donated;
    # apply_fn(state, acc, loss, num_tokens) -> (state, {grad_norm, skipped}), state donated.
    zeros_fn: Any = None
    accumulate_fn: Any = None
    apply_fn: Any = None
    platform: TrainingPlatform | None = None  # the platform's choices it was built with

    def init_state(self, params) -> TrainState:
        """A TrainState for `params` (placed per the state shardings when there is a mesh)."""
        make = lambda p: TrainState(jnp.zeros((), jnp.int32), p, self.optimizer.init(p))
        if self.mesh is None:
            return jax.jit(make)(params)
        return jax.jit(make, in_shardings=(self.state_shardings.params,),
                       out_shardings=self.state_shardings)(params)

    def put_batch(self, batch: TrainBatch) -> TrainBatch:
        """Check a host batch's shape against the micro-batches and mesh; move it to devices."""
        b, s = batch.tokens.shape
        rules = train_rules(self.rl_cfg)
        dp = 1 if self.mesh is None else _dp_size(self.mesh, rules)
        sp = 1 if self.mesh is None else math.prod(self.mesh.shape[a]
                                                   for a in seq_axes(self.mesh, rules))
        if s % sp:
            raise ValueError(f"batch rows have {s} positions; with sequence_parallel they must "
                             f"be a multiple of the {sp} chips each row is split over")
        n = self.rl_cfg.micro_batches
        if b % (n * dp):
            raise ValueError(f"batch has {b} sequences; it must be a multiple of micro_batches "
                             f"({n}) x data-parallel devices ({dp}); pack with "
                             f"num_seqs_multiple={n * dp}")
        if batch.routing is not None:  # the device copy in the narrowest id type
            batch = batch.replace(routing=batch.routing.astype(
                routing_dtype(self.model_cfg.n_routed_experts)))
        if self.mesh is None:
            return jax.device_put(batch)
        return jax.device_put(batch, self.batch_sharding)

    def __call__(self, state: TrainState, batch: TrainBatch) -> tuple[TrainState, dict]:
        return self.step_fn(state, self.put_batch(batch))

    def accumulated(self, state: TrainState, parts, num_tokens: int
                    ) -> tuple[TrainState, dict]:
        """One AdamW step over the batch made of `parts` (host `TrainBatch`es, each a call's
        rows): each call adds its gradient of the loss normalised by `num_tokens` (the whole
        batch's loss tokens) to one accumulator, then clip + AdamW + the guard run once. Equal
        to one call of `step_fn` on the whole batch, to float rounding. Returns the new state
        and the step's metrics (host numpy scalars)."""
        parts = list(parts)
        if not parts:
            raise ValueError("accumulated: no batch parts")
        n = jnp.asarray(num_tokens, jnp.int32)
        acc = self.zeros_fn(state.params)
        metrics = []
        for part in parts:
            acc, m = self.accumulate_fn(state.params, acc, self.put_batch(part), n)
            metrics.append(jax.device_get(m))
        out = combine_parts(metrics)
        state, applied = self.apply_fn(state, acc, jnp.asarray(out["loss"], jnp.float32), n)
        return state, {**out, **jax.device_get(applied)}

    def masked_grad_norm(self, params, batch: TrainBatch, keep) -> jax.Array:
        """The norm of the gradient's part from the loss positions in `keep` (bool [B, S]),
        under the whole batch's loss-token divisor: the parts of disjoint masks sum to the
        step's gradient (rl/roles.py). Does not donate or change `params`."""
        batch = self.put_batch(batch)
        keep = jax.device_put(keep) if self.mesh is None else jax.device_put(
            keep, self.batch_sharding)
        return self.grad_norm_fn(params, batch, keep)

    def logprobs(self, params, batch: TrainBatch):
        """The policy's (logp, entropy) [B, S] at every target of a batch (replaying routing)."""
        return self.logprob_fn(params, self.put_batch(batch))


def _dp_size(mesh: Mesh, rules=TRAIN_RULES) -> int:
    return math.prod(mesh.shape[a] for a in batch_axes(mesh, rules))


def train_rules(rl_cfg: RLConfig):
    """The update step's rules table: TRAIN_SEQ_RULES under `sequence_parallel`."""
    return TRAIN_SEQ_RULES if rl_cfg.sequence_parallel else TRAIN_RULES


def _micro_batch(x, j, n: int):
    """Micro-batch j of [B, ...]: rows j, j + n, j + 2n, ... (see the module doc)."""
    return jax.lax.dynamic_index_in_dim(x.reshape(x.shape[0] // n, n, *x.shape[1:]), j, 1,
                                        keepdims=False)


def _empty_metrics(shapes: dict) -> dict:
    """A micro-batch's metrics when it has no loss token: the loss's values on an empty mask
    (0 for sums and means, -inf / +inf for maxima / minima), and one empty micro-batch."""
    fill = {Reduce.MAX: -np.inf, Reduce.MIN: np.inf}
    out = {k: jnp.full(v.shape, fill.get(REDUCTIONS[k], 0), v.dtype) for k, v in shapes.items()
           if k != "empty_micro_batches"}
    return {**out, "empty_micro_batches": jnp.ones((), jnp.int32)}


def make_update_step(model_cfg: ModelConfig, rl_cfg: RLConfig, *, mesh: Mesh | None = None,
                     platform: TrainingPlatform | None = None) -> UpdateStep:
    """Build the jitted update step (and a jitted log-prob pass) for these configs on
    `platform` (None: `TrainingPlatform.for_mesh(mesh, ...)`)."""
    cfg = training_model_config(model_cfg, rl_cfg)
    if platform is None:
        platform = TrainingPlatform.for_mesh(mesh, cfg)
    ops = platform.ops
    opt = make_optimizer(rl_cfg)
    n_micro = rl_cfg.micro_batches
    table = train_rules(rl_cfg)
    rules = (lambda: use_rules(mesh, table)) if mesh is not None else None
    fused = platform.optimizer  # norm + clip + AdamW in one pass, or None
    # Params lay out the same under both tables (they differ only in activation axes).
    p_shard = M.param_shardings(cfg, mesh, TRAIN_RULES) if mesh is not None else None

    def zero_grads(params):
        """A gradient accumulator: zeros of each param's shape in at least float32."""
        return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype,
                                                                         jnp.float32)), params)

    def forward_logprobs(params, mb: TrainBatch):
        """(logp, entropy, MoE choices dropped at the expert-parallel capacity, all layers)."""
        keep = platform.keep_logits(*mb.tokens.shape, cfg.vocab_size)
        logp, entropy, _, dropped = sequence_logprobs(
            params, mb.tokens, mb.targets, cfg, segment_ids=mb.segment_ids,
            routing=mb.model_routing(), chunk=rl_cfg.logprob_chunk,
            temperature=rl_cfg.temperature, stats=platform.log_softmax, keep_logits=keep,
            ops=ops)
        return logp, entropy, (jnp.zeros((), jnp.int32) if dropped is None else jnp.sum(dropped))

    def policy_logprobs(params, mb: TrainBatch):
        return forward_logprobs(params, mb)[:2]

    def loss_fn(params, mb: TrainBatch, num_tokens):
        logp, entropy, dropped = forward_logprobs(params, mb)
        with jax.named_scope("loss"):  # the loss's ops, so named in a profile
            if rl_cfg.loss == LossKind.CISPO:
                lo_hi = dict(eps_low=rl_cfg.eps_low, eps_high=rl_cfg.eps_high,
                             cap_mode=rl_cfg.cap_mode)
                loss, metrics = cispo_loss(logp, mb.old_logp, mb.advantages, mb.loss_mask,
                                           num_tokens=num_tokens, **lo_hi)
            else:
                loss, metrics = sft_loss(logp, mb.loss_mask, num_tokens=num_tokens)
            count = jnp.maximum(metrics["loss_tokens"], 1)
            metrics["entropy"] = jnp.sum(jnp.where(mb.loss_mask, entropy, 0.0)) / count
        metrics["moe_dropped_choices"] = dropped
        return loss, metrics

    def grads_and_metrics(params, batch: TrainBatch, num_tokens, acc=None):
        """The gradient of the loss on `batch` (normalised by `num_tokens`), added to `acc`
        when given (an accumulator in the gradient's float32 layout), and its metrics."""
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if n_micro == 1:
            (_, metrics), grads = grad_fn(params, batch, num_tokens)
            if acc is not None:
                grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)
            return grads, {**metrics, "empty_micro_batches": jnp.zeros((), jnp.int32)}

        def add(acc, mb):
            (_, metrics), g = grad_fn(params, mb, num_tokens)
            acc = jax.tree.map(lambda a, x: a + x.astype(a.dtype), acc, g)
            return acc, {**metrics, "empty_micro_batches": jnp.zeros((), jnp.int32)}

        def one(acc, mb):
            # A micro-batch without a loss token (padding rows: a call is padded to a multiple
            # of the micro-batches) adds an exact zero to the gradient, so it is not run: its
            # metrics are what the loss gives an empty mask (`_empty_metrics`).
            acc, metrics = jax.lax.cond(
                jnp.any(mb.loss_mask), add,
                lambda acc, mb: (acc, _empty_metrics(jax.eval_shape(add, acc, mb)[1])), acc, mb)
            if p_shard is not None:
                acc = jax.lax.with_sharding_constraint(acc, p_shard)
            return acc, metrics

        # The scan runs over micro-batch indices and slices each micro-batch from the batch
        # in its own layout: scanning over the split batch made XLA:TPU re-lay out the whole
        # batch for the loop (the pod's uint16 routing [.., 40, 22], 3.7 GB per chip, became a
        # 20 GB copy with its 22-wide minor axis padded to 128).
        grads, stacked = jax.lax.scan(
            lambda acc, j: one(acc, jax.tree.map(lambda x: _micro_batch(x, j, n_micro), batch)),
            zero_grads(params) if acc is None else acc, jnp.arange(n_micro))
        if acc is None:
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        return grads, combine_metrics(stacked)

    def apply(state: TrainState, grads, loss, num_tokens):
        """Clip + AdamW on `grads` (the whole step's), or nothing when the guard trips: a
        non-finite gradient norm or loss, or no loss token at all. Returns the new state and
        {grad_norm, skipped}."""
        grad_norm = optax.tree.norm(grads) if fused is None else fused.global_norm(grads)
        ok = jnp.isfinite(grad_norm) & jnp.isfinite(loss) & (num_tokens > 0)
        metrics = {"grad_norm": grad_norm, "skipped": 1 - ok.astype(jnp.int32)}
        if fused is not None:  # the platform's one pass per parameter, optax's state
            params, opt_state = fused.adamw_update(rl_cfg, grads, state.opt_state, state.params,
                                                   grad_norm, ok)
            return TrainState(step=state.step + ok.astype(jnp.int32), params=params,
                              opt_state=opt_state), metrics
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # Frozen leaves: the old arrays themselves (p + 0.0 would turn a -0.0 into +0.0).
        params = jax.tree.map(lambda f, old, new: old if f else new,
                              frozen_mask(state.params, rl_cfg), state.params, params)
        keep = lambda old, new: jnp.where(ok, new, old)
        new_state = TrainState(step=state.step + ok.astype(jnp.int32),
                               params=jax.tree.map(keep, state.params, params),
                               opt_state=jax.tree.map(keep, state.opt_state, opt_state))
        return new_state, metrics

    def step(state: TrainState, batch: TrainBatch):
        num_tokens = jnp.sum(batch.loss_mask, dtype=jnp.int32)
        if rules is not None:
            with rules():
                grads, metrics = grads_and_metrics(state.params, batch, num_tokens)
        else:
            grads, metrics = grads_and_metrics(state.params, batch, num_tokens)
        metrics.update(_batch_metrics(batch, rl_cfg))
        state, applied = apply(state, grads, metrics["loss"], num_tokens)
        return state, {**metrics, **applied}

    def accumulate(params, acc, batch: TrainBatch, num_tokens):
        """acc + this part's gradient of the loss normalised by `num_tokens` (the whole
        step's loss tokens), and the part's metrics; `acc` is donated and the micro-batch
        scan adds into it."""
        if rules is not None:
            with rules():
                grads, metrics = grads_and_metrics(params, batch, num_tokens, acc)
        else:
            grads, metrics = grads_and_metrics(params, batch, num_tokens, acc)
        return grads, {**metrics, **_batch_sums(batch, rl_cfg)}

    def logprob_pass(params, batch: TrainBatch):
        if rules is not None:
            with rules():
                return policy_logprobs(params, batch)
        return policy_logprobs(params, batch)

    def masked_grad_norm(params, batch: TrainBatch, keep):
        num_tokens = jnp.sum(batch.loss_mask, dtype=jnp.int32)
        part = batch.replace(loss_mask=batch.loss_mask & keep)
        if rules is not None:
            with rules():
                grads, _ = grads_and_metrics(params, part, num_tokens)
        else:
            grads, _ = grads_and_metrics(params, part, num_tokens)
        return optax.tree.norm(grads)

    options = platform.compiler_options
    if mesh is None:
        return UpdateStep(
            cfg, rl_cfg, None, opt,
            jax.jit(step, donate_argnames="state", compiler_options=options),
            jax.jit(logprob_pass, compiler_options=options), None, None,
            jax.jit(masked_grad_norm, compiler_options=options),
            zeros_fn=jax.jit(zero_grads, compiler_options=options),
            accumulate_fn=jax.jit(accumulate, donate_argnames="acc", compiler_options=options),
            apply_fn=jax.jit(apply, donate_argnames="state", compiler_options=options),
            platform=platform)

    replicated = NamedSharding(mesh, PartitionSpec())
    dp_axes, sp_axes = batch_axes(mesh, table), seq_axes(mesh, table)
    batch_sh = NamedSharding(mesh, PartitionSpec(dp_axes or None, sp_axes or None))
    state_sh = TrainState(step=replicated, params=p_shard,
                          opt_state=opt_state_shardings(opt, cfg, p_shard, replicated))
    step_fn = jax.jit(step, in_shardings=(state_sh, batch_sh),
                      out_shardings=(state_sh, replicated), donate_argnames="state",
                      compiler_options=options)
    logprob_fn = jax.jit(logprob_pass, in_shardings=(p_shard, batch_sh),
                         out_shardings=batch_sh, compiler_options=options)
    grad_norm_fn = jax.jit(masked_grad_norm, in_shardings=(p_shard, batch_sh, batch_sh),
                           out_shardings=replicated, compiler_options=options)
    # The accumulator lies like the params (the gradient's layout); each call takes it donated
    # and adds into it, so the step holds one of it at a time.
    zeros_fn = jax.jit(zero_grads, in_shardings=(p_shard,), out_shardings=p_shard,
                       compiler_options=options)
    accumulate_fn = jax.jit(accumulate, in_shardings=(p_shard, p_shard, batch_sh, replicated),
                            out_shardings=(p_shard, replicated), donate_argnames="acc",
                            compiler_options=options)
    apply_fn = jax.jit(apply, in_shardings=(state_sh, p_shard, replicated, replicated),
                       out_shardings=(state_sh, replicated), donate_argnames="state",
                       compiler_options=options)
    return UpdateStep(cfg, rl_cfg, mesh, opt, step_fn, logprob_fn, state_sh, batch_sh,
                      grad_norm_fn, zeros_fn=zeros_fn, accumulate_fn=accumulate_fn,
                      apply_fn=apply_fn, platform=platform)


# Statistics of a part of an accumulated step that add up across its calls (`_batch_sums`),
# and how they combine; `_part_metrics` turns them into `_batch_metrics`'s fields.
_PART_SUMS = {"tokens": np.sum, "adv_count": np.sum, "adv_sum": np.sum, "adv_sq_sum": np.sum,
              "token_adv_min": np.min, "token_adv_max": np.max}


def _batch_sums(batch: TrainBatch, rl_cfg: RLConfig) -> dict:
    out = {"tokens": jnp.sum(batch.segment_ids > 0, dtype=jnp.int32)}
    if rl_cfg.loss == LossKind.CISPO:
        mask, a = batch.loss_mask, batch.advantages
        out["adv_count"] = jnp.sum(mask, dtype=jnp.int32)
        out["adv_sum"] = jnp.sum(jnp.where(mask, a, 0.0))
        out["adv_sq_sum"] = jnp.sum(jnp.where(mask, a * a, 0.0))
        out["token_adv_min"] = jnp.min(jnp.where(mask, a, jnp.inf))
        out["token_adv_max"] = jnp.max(jnp.where(mask, a, -jnp.inf))
    return out


def combine_parts(parts: list[dict]) -> dict:
    """One accumulated step's metrics from its calls' (host numpy scalars): the loss metrics
    reduced as the micro-batch scan reduces them (`losses.REDUCTIONS`), the batch statistics
    as one call on the whole batch would give them."""
    stacked = {k: np.stack([np.asarray(p[k]) for p in parts]) for k in parts[0]}
    loss_keys = {k: v for k, v in stacked.items() if k not in _PART_SUMS}
    out = {k: np.asarray(v) for k, v in combine_metrics(loss_keys).items()}
    sums = {k: how(stacked[k]) for k, how in _PART_SUMS.items() if k in stacked}
    out["tokens"] = sums["tokens"]
    if "adv_count" in sums:
        count = max(float(sums["adv_count"]), 1.0)
        mean = float(sums["adv_sum"]) / count
        out["token_adv_mean"] = np.float32(mean)
        out["token_adv_std"] = np.float32(np.sqrt(max(float(sums["adv_sq_sum"]) / count
                                                      - mean * mean, 0.0)))
        out["token_adv_min"] = sums["token_adv_min"]
        out["token_adv_max"] = sums["token_adv_max"]
    return out


def _batch_metrics(batch: TrainBatch, rl_cfg: RLConfig) -> dict:
    """Real tokens, and advantage statistics over loss tokens (shaping included; the per-rollout
    ones, with kept/dropped groups, come from the host: `BuildStats.as_metrics`)."""
    out = {"tokens": jnp.sum(batch.segment_ids > 0, dtype=jnp.int32)}
    if rl_cfg.loss == LossKind.CISPO:
        mask = batch.loss_mask
        count = jnp.maximum(jnp.sum(mask), 1)
        a = batch.advantages
        mean = jnp.sum(jnp.where(mask, a, 0.0)) / count
        out["token_adv_mean"] = mean
        out["token_adv_std"] = jnp.sqrt(jnp.sum(jnp.where(mask, (a - mean) ** 2, 0.0)) / count)
        out["token_adv_min"] = jnp.min(jnp.where(mask, a, jnp.inf))
        out["token_adv_max"] = jnp.max(jnp.where(mask, a, -jnp.inf))
    return out


def opt_state_shardings(opt: optax.GradientTransformation, cfg: ModelConfig, p_shard,
                        replicated: NamedSharding):
    """Shardings of the optimizer state: each moment leaf takes the sharding of the parameter
    whose tree path ends its own path (mu/nu mirror the params); scalars are replicated."""
    abstract = M.abstract_params(cfg)
    by_path = {tuple(path): (s, a.shape) for (path, s), a in zip(
        jax.tree_util.tree_flatten_with_path(p_shard)[0], jax.tree.leaves(abstract))}

    def pick(path, leaf):
        for i in range(len(path)):
            hit = by_path.get(tuple(path[i:]))
            if hit is not None and hit[1] == leaf.shape:
                return hit[0]
        if leaf.ndim == 0:
            return replicated
        raise ValueError(f"optimizer state leaf {jax.tree_util.keystr(path)} {leaf.shape} "
                         "matches no parameter; cannot choose its sharding")

    return jax.tree_util.tree_map_with_path(pick, jax.eval_shape(opt.init, abstract))
