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

A dict value (a counter such as `org/titles`) is summed key by key. An environment's own metrics
need no code here: a new name falls to `mean` unless a row of the table says otherwise.

A ratio over rollouts whose denominator is not the host's weight (a measure of
`avalon/analysis/metrics.py`: reviews over teams, co-ordination seconds over working seconds,
messages over agents) comes as its sums, not its value, whatever its name:
- `Pooled(num, den)`: hosts add numerators and denominators, and the record holds
  sum(num) / sum(den), the measure over the union of rollouts (`metrics.value`, the report's
  number on the same logs), left out where no host has a denominator (the report's "n/a"). A
  mean of each host's ratio weighted by its rollouts is another number: host 0's 3 rollouts
  with one team, which reviewed (1 of 1), beside host 1's one rollout, a team that did not
  (0 of 1), is 0.75 weighted and 0.5 pooled (teams with a review: 1 of 2).
- `Shares(counts, total)`: a family of shares of one total (rollouts by how they ended, under
  `<name><kind>`): counts added kind by kind and totals added, so a kind one host never saw
  counts 0 of that host's total instead of being missing there.
A std beside a pooled mean (`reward/std` beside `reward/mean`) pools with weights that mean's
denominators.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping

# (kind, text, reduction): kind "exact" matches the whole name, "prefix" / "suffix" its ends,
# "last" the part after the last "/". First match wins; no match is "mean".
REDUCTIONS: tuple[tuple[str, str, str], ...] = (
    ("suffix", "/std", "std"), ("suffix", "_std", "std"),
    ("suffix", "_max", "max"), ("suffix", "/max", "max"),
    ("suffix", "_min", "min"), ("suffix", "/min", "min"),
    ("prefix", "time/", "max"), ("prefix", "host/", "max"),
    ("exact", "engine/live_rows_mean", "mean"), ("exact", "engine/live_row_fill", "mean"),
    ("prefix", "engine/", "sum"), ("exact", "perf/rollouts_per_hour", "sum"),
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
    ("last", "empty_micro_batches", "sum"),
    ("last", "dropped_all_zero", "sum"), ("last", "dropped_all_equal", "sum"),
    ("exact", "rollout/refilled_groups", "sum"), ("exact", "rollout/groups_without_signal", "sum"),
)

KINDS = ("mean", "sum", "max", "min", "std")


@dataclasses.dataclass(frozen=True)
class Pooled:
    """A ratio's sums over one host's rollouts: numerator and denominator (see the module
    doc)."""

    num: float
    den: float

    @property
    def value(self) -> float | None:
        """num / den; None (n/a) without a denominator."""
        return self.num / self.den if self.den > 0 else None


@dataclasses.dataclass(frozen=True)
class Shares:
    """Counts of each kind out of one total (see the module doc): `<name><kind>` is
    counts[kind] / total."""

    counts: Mapping[str, float]
    total: float


def finish(metrics: Mapping) -> dict:
    """The record from one host's (or the combined) metrics: each `Pooled` as its value (left
    out where n/a), each `Shares` as one share per kind; every other value as it is."""
    out = {}
    for name, v in metrics.items():
        if isinstance(v, Pooled):
            if v.value is not None:
                out[name] = v.value
        elif isinstance(v, Shares):
            if v.total > 0:
                out.update({f"{name}{kind}": n / v.total for kind, n in sorted(v.counts.items())})
        else:
            out[name] = v
    return out


def _plain(v) -> float:
    return v.value if isinstance(v, Pooled) else v


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
    """Each host's (metrics, weight), in process order, combined name by name (see the module
    doc); `Pooled` and `Shares` stay sums (`finish` makes the record). Pure: the same on every
    process."""
    names = list(dict.fromkeys(k for m, _ in parts for k in m))
    out = {}
    for name in names:
        held = [(m[name], w, m) for m, w in parts if name in m]
        pooled = [isinstance(v, Pooled) for v, _, _ in held]
        shares = [isinstance(v, Shares) for v, _, _ in held]
        if any(pooled) or any(shares):
            # Sums add over every host that has them, whatever its weight.
            if not (all(pooled) or all(shares)):
                raise ValueError(f"host_metrics: {name!r} is a ratio's sums on some hosts and "
                                 "a value on others")
            if all(pooled):
                out[name] = Pooled(sum(v.num for v, _, _ in held),
                                   sum(v.den for v, _, _ in held))
            else:
                counts: dict[str, float] = {}
                for v, _, _ in held:
                    for kind, n in v.counts.items():
                        counts[kind] = counts.get(kind, 0) + n
                out[name] = Shares(counts, sum(v.total for v, _, _ in held))
            continue
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
                    if all(isinstance(x, Pooled) for x in means):
                        # Each host's std is over its mean's denominator (its rollouts).
                        kept = [(v, x) for v, x in zip(values, means) if x.den > 0]
                        if not kept:  # no rollout behind any host's mean: no std
                            continue
                        values = [v for v, _ in kept]
                        weights = [x.den for _, x in kept]
                        total_w = sum(weights)
                        means = [x for _, x in kept]
                    means = [_plain(x) for x in means]
                    mu = sum(w * x for w, x in zip(weights, means)) / total_w
                    second = sum(w * (s * s + x * x)
                                 for w, s, x in zip(weights, values, means)) / total_w
                    out[name] = math.sqrt(max(second - mu * mu, 0.0))
                    continue
            out[name] = float(sum(w * v for w, v in zip(weights, values)) / total_w)
    return out


def payload(metrics: Mapping, weight: float) -> bytes:
    """One host's (metrics, weight) as the bytes `reduce_across_hosts` gathers: values, and
    the sums of each `Pooled` and `Shares` apart from them (a counter's keys are free text, so
    no key inside one could mark a ratio)."""
    plain, pooled, shares = {}, {}, {}
    for name, v in metrics.items():
        if isinstance(v, Pooled):
            pooled[name] = [v.num, v.den]
        elif isinstance(v, Shares):
            shares[name] = [dict(v.counts), v.total]
        else:
            plain[name] = v
    return json.dumps({"values": plain, "pooled": pooled, "shares": shares,
                       "weight": weight}).encode()


def from_payloads(parts: list[bytes]) -> dict:
    """The record from every host's `payload`, in process order."""
    hosts = []
    for p in parts:
        d = json.loads(p.decode())
        m = dict(d["values"])
        m.update({k: Pooled(*v) for k, v in d["pooled"].items()})
        m.update({k: Shares(*v) for k, v in d["shares"].items()})
        hosts.append((m, d["weight"]))
    return finish(combine(hosts))


def reduce_across_hosts(metrics: dict, weight: float = 1.0) -> dict:
    """The record of every process's (metrics, weight) (`combine`, then `finish`); every
    process must call it."""
    from avalon.train import distributed
    parts = distributed.allgather_bytes(payload(metrics, weight))
    if len(parts) == 1:
        return finish(metrics)
    return from_payloads(parts)
