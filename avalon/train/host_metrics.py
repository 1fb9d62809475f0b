"""Metrics reduced across processes by name: each host's numbers, one record.

Every process computes metrics over what it played (its share of the step's groups, of an
evaluation's tasks); process 0 logs one record. `reduce_across_hosts(metrics, weight)` gathers
every process's dict (in process order: `distributed.allgather_bytes`, so every process gets
the same answer and runs the same collectives, whatever names it holds) and combines them over
the *union* of names: a name only some hosts report (an environment only they played, a metric
of a host with rollouts beside one without) is reduced over the hosts that report it.

Each name's reduction comes from `REDUCTIONS`, first match wins (`reduction(name)`):

- `sum`: counts and rates that add up over hosts (rollouts, kept groups, packed tokens, engine
  counters, generated tokens per second);
- `max` / `min`: extremes (`*_max`, `*_min`) and the slowest host's time (`time/`) and memory;
- `std`: a standard deviation pooled with its mean (`x/std` beside `x/mean`, `x_std` beside
  `x_mean`, or `eval/org_reward/std` beside `eval/org_reward`): the population std of the union;
- `mean` (everything else): weighted by each host's `weight` (what its mean is over: rollouts,
  groups), so a mean over uneven shares is the mean over the union, as one host would log it.
  A host of weight 0 (it played nothing) takes no part in means, extremes or deviations.

A dict value (a counter such as `org/titles`) is summed key by key. Issue-specific metrics need
no code here: a new name falls to `mean` unless a row of the table says otherwise.
"""

from __future__ import annotations

import json
import math

# (kind, text, reduction): kind "exact" matches the whole name, "prefix" / "suffix" its ends,
# "last" the part after the last "/". First match wins; no match is "mean".
REDUCTIONS: tuple[tuple[str, str, str], ...] = (
    ("suffix", "/std", "std"), ("suffix", "_std", "std"),
    ("suffix", "_max", "max"), ("suffix", "/max", "max"),
    ("suffix", "_min", "min"), ("suffix", "/min", "min"),
    ("prefix", "time/", "max"), ("prefix", "host/", "max"),
    ("prefix", "engine/", "sum"),
    ("suffix", "tokens_per_s", "sum"),
    ("suffix", "_rollouts", "sum"),
    ("exact", "rollouts", "sum"),
    ("exact", "processes", "max"),
    # host-side batch statistics (`rl.build.BuildStats.as_metrics`) that add up
    ("last", "groups", "sum"), ("last", "kept_groups", "sum"), ("last", "dropped_groups", "sum"),
    ("last", "rollouts", "sum"), ("last", "pack_rows", "sum"), ("last", "pack_skipped_rows", "sum"),
    ("last", "pack_sequences", "sum"), ("last", "pack_tokens", "sum"),
    ("last", "pack_loss_tokens", "sum"), ("last", "pack_padding", "sum"),
    ("last", "pack_unpredictable_loss_tokens", "sum"), ("last", "loss_tokens", "sum"),
)

KINDS = ("mean", "sum", "max", "min", "std")


def reduction(name: str) -> str:
    """How `name` combines across hosts (see `REDUCTIONS`)."""
    last = name.rsplit("/", 1)[-1]
    for kind, text, how in REDUCTIONS:
        if ((kind == "exact" and name == text) or (kind == "prefix" and name.startswith(text))
                or (kind == "suffix" and name.endswith(text))
                or (kind == "last" and last == text)):
            return how
    return "mean"


def _mean_names(std_name: str) -> list[str]:
    """The names of the mean a std goes with: `x/mean` or `x_mean`, else the bare `x`."""
    for end, mean_end in (("/std", "/mean"), ("_std", "_mean")):
        if std_name.endswith(end):
            return [std_name[:-len(end)] + mean_end, std_name[:-len(end)]]
    return []


def combine(parts: list[tuple[dict, float]]) -> dict:
    """One record from each host's (metrics, weight), in process order (see the module doc).
    Pure: the same on every process."""
    names = list(dict.fromkeys(k for m, _ in parts for k in m))
    out = {}
    for name in names:
        held = [(m[name], w, m) for m, w in parts if name in m]
        how = reduction(name)
        if how != "sum" and any(w > 0 for _, w, _ in held):
            # A host that played nothing (an empty share) has nothing to average or bound:
            # its mean of no rollouts is NaN, not a value.
            held = [h for h in held if h[1] > 0]
        values = [v for v, _, _ in held]
        if isinstance(values[0], dict):
            total: dict = {}
            for v in values:
                for k, n in v.items():
                    total[k] = total.get(k, 0) + n
            out[name] = dict(sorted(total.items(), key=lambda kv: -kv[1]))
            continue
        if how == "sum":
            out[name] = float(sum(values))
        elif how == "max":
            out[name] = float(max(values))
        elif how == "min":
            out[name] = float(min(values))
        else:
            weights = [w for _, w, _ in held]
            total_w = sum(weights)
            if total_w <= 0:  # nothing behind any of them: an unweighted mean
                weights, total_w = [1.0] * len(held), float(len(held))
            if how == "std":
                found = [k for k in _mean_names(name) if all(k in m for _, _, m in held)]
                if found:
                    mean_key = found[0]
                    means = [m[mean_key] for _, _, m in held]
                    mu = sum(w * x for w, x in zip(weights, means)) / total_w
                    second = sum(w * (s * s + x * x)
                                 for w, s, x in zip(weights, values, means)) / total_w
                    out[name] = math.sqrt(max(second - mu * mu, 0.0))
                    continue
            out[name] = float(sum(w * v for w, v in zip(weights, values)) / total_w)
    return out


def reduce_across_hosts(metrics: dict, weight: float = 1.0) -> dict:
    """`combine` over every process's (metrics, weight); every process must call it."""
    from avalon.train import distributed
    parts = distributed.allgather_bytes(json.dumps([metrics, weight]).encode())
    if len(parts) == 1:
        return dict(metrics)
    return combine([tuple(json.loads(p.decode())) for p in parts])
