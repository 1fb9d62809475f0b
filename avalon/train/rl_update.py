"""The update half of an RLCR step: from the step's played groups to the new params.

    update = RLUpdate(cfg, setup.rl_step)
    state, out = update(state, groups, rl_step)    # out.metrics, out.build, out.times

Advantages and packing build one host batch of the kept groups' rows (`rl.build`); when no
group is kept on any process there is no update call at all (the params, the optimizer state
and its step counter stay as they are; `skipped` = 1, `updates` = 0). Otherwise the batch is
cut into update calls of the plan's rows (`train/batch_plan.py`), each call's positions cut to
the shortest length rung its rows fit (`rollout.update_length_rungs`: packed rows at the tail
of the batch are part empty, and a call costs in proportion to its positions), and:

- `rl.update_mode = one` (the recipe): one AdamW step for the whole step, its gradient summed
  over the calls, each normalised by the whole batch's loss tokens (`UpdateStep.accumulated`;
  equal to one call on the whole batch to float rounding, tests/rl/test_update_accumulated.py);
- `per_call`: each call its own AdamW step over its own tokens (the earlier behaviour; kept as
  a named option), metrics combined per `_combine_updates`.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from avalon.rl.build import BuildStats, build_rl_batch
from avalon.rl.config import UpdateMode
from avalon.rl.roles import role_grad_norms
from avalon.rl.update import TrainState, UpdateStep
from avalon.train import batch_plan
from avalon.train.distributed import barrier, max_across_hosts, sum_across_hosts
from avalon.train.setup import global_batch


@dataclasses.dataclass
class UpdateResult:
    metrics: dict  # the update's metrics (`train/*`)
    build: BuildStats
    times: dict  # time/build_s, time/update_s
    rows: list[int]  # positions of each update call (its length rung)


class RLUpdate:
    """Builds a step's batch and updates the params (see the module docstring)."""

    def __init__(self, cfg, step_fn: UpdateStep, num_processes: int = 1):
        self.cfg, self.step_fn = cfg, step_fn
        self.plan = batch_plan.rl_plan(cfg, num_processes)
        m = cfg.model
        self.routing = (m.count("E"), m.num_experts_per_tok) if m.count("E") else None

    def _build(self, groups, min_seqs: int = 0):
        return build_rl_batch(groups, self.cfg.rl, seq_len=self.cfg.rollout.seq_len,
                              num_seqs_multiple=self.plan.local_multiple, min_seqs=min_seqs,
                              routing_shape=self.routing)

    def __call__(self, state: TrainState, groups, rl_step: int
                 ) -> tuple[TrainState, UpdateResult]:
        cfg, step_fn, plan = self.cfg, self.step_fn, self.plan
        t0 = time.perf_counter()
        batch, bstats = self._build(groups)
        if max_across_hosts(bstats.advantages.kept_groups) == 0:
            # Nothing kept anywhere: an update would only apply momentum and weight decay.
            return state, UpdateResult(
                {"skipped": 1.0, "updates": 0.0, "calls": 0.0, "loss_tokens": 0.0,
                 "tokens": 0.0}, bstats,
                {"time/build_s": time.perf_counter() - t0, "time/update_s": 0.0}, [])
        most = max_across_hosts(batch.tokens.shape[0])
        calls, per_call = plan.calls(most)  # per_call: this process's rows of each call
        if batch.tokens.shape[0] != calls * per_call:
            batch, bstats = self._build(groups, min_seqs=calls * per_call)
        order = _micro_major(np.asarray(batch.loss_mask).any(axis=1), per_call,
                             cfg.rl.micro_batches)
        batch = jax.tree.map(lambda a: np.asarray(a)[order], batch)
        if bstats.roles is not None:
            bstats = dataclasses.replace(bstats, roles=bstats.roles[order])
        parts = [jax.tree.map(lambda a, c=c: np.asarray(a)[c * per_call:(c + 1) * per_call],
                              batch) for c in range(calls)]
        lengths = [plan.call_length(max_across_hosts(_used_positions(p))) for p in parts]
        parts = [_cut(p, n) for p, n in zip(parts, lengths)]
        t_build = time.perf_counter() - t0

        put = lambda x: global_batch(x, step_fn.batch_sharding)
        every = cfg.rl.role_grad_every  # per-role gradient norms, before the state is donated
        roles = role_grad_norms(step_fn.masked_grad_norm, state.params, put(parts[0]),
                                bstats.roles[:per_call, :lengths[0]], put) \
            if every and rl_step % every == 0 else {}
        t1 = time.perf_counter()
        barrier("rl_update")  # the hosts come from uneven rollouts
        if cfg.rl.update_mode == UpdateMode.ONE:
            loss_tokens = sum_across_hosts(int(np.asarray(batch.loss_mask).sum()))
            state, m = step_fn.accumulated(state, [put(p) for p in parts], loss_tokens)
            m = {k: float(v) for k, v in m.items()} | {"updates": 1.0, "calls": float(calls)}
        else:
            updates = []
            for p in parts:
                state, m = step_fn(state, put(p))
                updates.append({k: float(v) for k, v in m.items()})
            m = _combine_updates(updates) | {"calls": float(calls)}
        return state, UpdateResult(m | roles, bstats,
                                   {"time/build_s": t_build,
                                    "time/update_s": time.perf_counter() - t1}, lengths)


def _micro_major(has_loss: np.ndarray, per_call: int, micro_batches: int) -> np.ndarray:
    """A row order of the batch under which each call's rows with loss tokens fill its
    micro-batches one after another (micro-batch j of a call takes rows j, j + n, j + 2n, ...:
    `rl.update._micro_batch`), so the padding rows make whole micro-batches, which the step
    does not run. The gradient is a sum over rows, so the order changes nothing else."""
    order = np.arange(len(has_loss))
    n = micro_batches
    if n <= 1 or per_call % n:
        return order
    m = per_call // n  # rows of a micro-batch
    for start in range(0, len(has_loss), per_call):
        rows = order[start:start + per_call]
        ranked = rows[np.argsort(~has_loss[rows], kind="stable")]  # loss rows first, in order
        # The k-th ranked row goes to micro-batch k // m, its (k % m)-th row.
        k = np.arange(len(ranked))
        placed = np.empty_like(ranked)
        placed[(k % m) * n + k // m] = ranked
        order[start:start + per_call] = placed
    return order


def _used_positions(batch) -> int:
    """Positions up to the last real token of any row (0 for an all-padding part)."""
    real = np.asarray(batch.segment_ids) > 0
    if not real.any():
        return 0
    return int(np.flatnonzero(real.any(axis=0)).max()) + 1


def _cut(batch, n: int):
    """The part's first n positions (everything after them is padding)."""
    if n == batch.tokens.shape[1]:
        return batch
    return jax.tree.map(lambda a: np.asarray(a)[:, :n], batch)


# The update step's metrics over several calls of one RL step (`UpdateMode.PER_CALL`):
# counts add up, extremes stay extremes, the rest are means weighted by loss tokens.
_UPDATE_SUMS = frozenset({"tokens", "loss_tokens", "skipped", "moe_dropped_choices",
                          "empty_micro_batches"})


def _combine_updates(updates: list[dict]) -> dict:
    if len(updates) == 1:
        return {**updates[0], "updates": 1.0}
    out = {}
    weights = [u.get("loss_tokens", 1.0) for u in updates]
    total = sum(weights) or float(len(updates))
    weights = weights if sum(weights) else [1.0] * len(updates)
    for k in updates[0]:
        values = [u[k] for u in updates]
        if k in _UPDATE_SUMS:
            out[k] = float(sum(values))
        elif k.endswith("_max"):
            out[k] = float(max(values))
        elif k.endswith("_min"):
            out[k] = float(min(values))
        else:
            out[k] = float(sum(w * v for w, v in zip(weights, values)) / total)
    out["updates"] = float(len(updates))
    return out
