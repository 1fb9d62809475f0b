"""Statistics of the report (SPEC §5): Wilcoxon signed-rank, sign counts, Wilson and bootstrap
intervals, and for ratios of sums over rollouts (every measure of `metrics.py`) the delta
method's standard error, a bootstrap interval and the paired shift. Pure Python and numpy; no
scipy needed.

`wilcoxon(x, y)` is the test the report runs over benchmark pairs: differences d = x - y, zero
differences dropped (the report's convention, Wilcoxon's "wilcox" zero method), |d| ranked
with average ranks for ties, W+ = the sum of the ranks of positive differences. For n <= 25
non-zero pairs the two-sided p-value is exact: the null distribution of W+ is enumerated over
all 2^n sign assignments *with the tied ranks as they are* (by counting, over doubled ranks,
which are integers), and p = min(1, 2 min(P(W+ <= w), P(W+ >= w))). For larger n it is the
normal approximation with the tie-corrected variance and a continuity correction of 0.5.
Differences are rounded to 12 decimals before comparing, so float noise (0.3 - 0.1 vs 0.2)
neither makes nor breaks a tie or a zero.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

EXACT_MAX_N = 25
_DECIMALS = 12


@dataclasses.dataclass(frozen=True)
class WilcoxonResult:
    n: int  # non-zero differences (the pairs the test uses)
    n_up: int  # x > y
    n_down: int  # x < y
    n_ties: int  # x == y (dropped)
    w_plus: float  # sum of the ranks of the positive differences
    w_minus: float
    p_value: float  # two-sided
    exact: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SignResult:
    n_up: int
    n_down: int
    n_ties: int
    p_value: float  # two-sided exact binomial (p = 1/2) over the non-tied pairs

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _pairs(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"paired samples need equal 1-d shapes, got {x.shape} and {y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("paired samples must be finite")
    return np.round(x - y, _DECIMALS)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of `values`, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), np.float64)
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1  # mean of ranks i+1 .. j+1
        i = j + 1
    return ranks


def signed_rank_distribution(ranks: Sequence[float]) -> dict[float, int]:
    """How many of the 2^n sign assignments give each value of W+, for these (tied) ranks."""
    doubled = [int(round(2 * r)) for r in ranks]  # average ranks are multiples of 1/2
    if any(abs(d - 2 * r) > 1e-9 for d, r in zip(doubled, ranks)):
        raise ValueError(f"ranks must be multiples of 1/2, got {list(ranks)}")
    counts = np.zeros(sum(doubled) + 1, dtype=object)  # exact integers (2^25 fits, but be safe)
    counts[0] = 1
    for d in doubled:
        shifted = np.zeros_like(counts)
        shifted[d:] = counts[:len(counts) - d]
        counts = counts + shifted
    return {s / 2: int(c) for s, c in enumerate(counts) if c}


def wilcoxon(x: Sequence[float], y: Sequence[float]) -> WilcoxonResult:
    """The two-sided Wilcoxon signed-rank test of x against y (see the module docstring)."""
    d = _pairs(x, y)
    n_up, n_down = int(np.sum(d > 0)), int(np.sum(d < 0))
    n_ties = len(d) - n_up - n_down
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return WilcoxonResult(0, 0, 0, n_ties, 0.0, 0.0, 1.0, True)
    ranks = average_ranks(np.abs(d))
    w_plus = float(ranks[d > 0].sum())
    w_minus = float(ranks[d < 0].sum())
    if n <= EXACT_MAX_N:
        dist = signed_rank_distribution(ranks)
        total = 2 ** n
        lo = sum(c for w, c in dist.items() if w <= w_plus + 1e-9)
        hi = sum(c for w, c in dist.items() if w >= w_plus - 1e-9)
        p = min(1.0, 2 * min(lo, hi) / total)
        return WilcoxonResult(n, n_up, n_down, n_ties, w_plus, w_minus, p, True)
    mean = n * (n + 1) / 4
    _, tie_counts = np.unique(np.abs(d), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24 - float(np.sum(tie_counts ** 3 - tie_counts)) / 48
    z = max(abs(w_plus - mean) - 0.5, 0.0) / math.sqrt(var) if var > 0 else 0.0
    p = min(1.0, math.erfc(z / math.sqrt(2)))
    return WilcoxonResult(n, n_up, n_down, n_ties, w_plus, w_minus, p, False)


def sign_test(x: Sequence[float], y: Sequence[float]) -> SignResult:
    """Sign counts of x - y and the exact two-sided sign test over the non-tied pairs."""
    d = _pairs(x, y)
    up, down = int(np.sum(d > 0)), int(np.sum(d < 0))
    n = up + down
    k = min(up, down)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n if n else 0.5
    return SignResult(up, down, len(d) - n, min(1.0, 2 * tail))


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """The Wilson score interval of a proportion successes / n."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return Interval(0.0, 0.0, 1.0, confidence)
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 (or n) successes the bound is exactly 0 (or 1); the formula leaves float noise.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, confidence)


def bootstrap_mean(x: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                   seed: int = 0) -> Interval:
    """The percentile bootstrap interval of the mean of x."""
    x = np.asarray(x, np.float64)
    _z(confidence)
    if x.size == 0:
        raise ValueError("bootstrap_mean of an empty sample")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    a = (1 - confidence) / 2
    return Interval(float(x.mean()), float(np.quantile(means, a)),
                    float(np.quantile(means, 1 - a)), confidence)


def paired_bootstrap(x: Sequence[float], y: Sequence[float], *, confidence: float = 0.95,
                     resamples: int = 10_000, seed: int = 0) -> Interval:
    """The percentile bootstrap interval of mean(x - y), resampling pairs together."""
    d = _pairs(x, y)
    if d.size == 0:
        raise ValueError("paired_bootstrap of empty samples")
    return bootstrap_mean(d, confidence=confidence, resamples=resamples, seed=seed)


# ----- ratios of sums over rollouts (every measure of `metrics.py`) ----------------------------
#
# A checkpoint's measure is R = sum(num) / sum(den) over its rollouts (a mean over rollouts is
# den = 1; a share over teams is den = 1 for a team). Its standard error is the delta method's,
# with the rollout as the unit (so hires or messages of one rollout are not taken as
# independent): z_i = (num_i - R den_i) / mean(den), SE = sd(z) / sqrt(n). For a mean this is
# the usual sd / sqrt(n).

def _ratio_arrays(num: Sequence[float], den: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if num.ndim != 1 or num.shape != den.shape:
        raise ValueError(f"ratio needs equal 1-d numerators and denominators, got {num.shape} "
                         f"and {den.shape}")
    return num, den


def ratio_se(num: Sequence[float], den: Sequence[float]) -> float | None:
    """The delta-method standard error of sum(num) / sum(den) (None: no denominator, or one
    rollout)."""
    num, den = _ratio_arrays(num, den)
    if den.sum() <= 0 or len(num) < 2:
        return None
    r = num.sum() / den.sum()
    z = (num - r * den) / den.mean()
    return float(z.std(ddof=1) / math.sqrt(len(z)))


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, confidence: float = 0.95,
                    resamples: int = 10_000, seed: int = 0) -> Interval | None:
    """The percentile bootstrap interval of sum(num) / sum(den), resampling rollouts (resamples
    with no denominator are left out); None without a denominator."""
    num, den = _ratio_arrays(num, den)
    _z(confidence)
    if den.sum() <= 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num.size, size=(resamples, num.size))
    d = den[idx].sum(axis=1)
    ok = d > 0
    ratios = num[idx].sum(axis=1)[ok] / d[ok]
    a = (1 - confidence) / 2
    return Interval(float(num.sum() / den.sum()), float(np.quantile(ratios, a)),
                    float(np.quantile(ratios, 1 - a)), confidence)


@dataclasses.dataclass(frozen=True)
class Shift:
    """A paired change of a ratio measure between two checkpoints (pair i: the same task and
    seed at both)."""

    n: int  # pairs
    first: float
    last: float
    diff: float  # last - first
    se: float | None  # delta method over pairs (None: fewer than 2 pairs)
    z: float | None  # diff / se (None where se is None or 0)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def paired_ratio_shift(first_num: Sequence[float], first_den: Sequence[float],
                       last_num: Sequence[float], last_den: Sequence[float]) -> Shift | None:
    """last - first of sum(num) / sum(den) over paired rollouts, with the delta method's SE of
    the difference: z_i = (c_i - R2 d_i) / mean(d) - (a_i - R1 b_i) / mean(b). None when either
    side has no denominator."""
    a, b = _ratio_arrays(first_num, first_den)
    c, d = _ratio_arrays(last_num, last_den)
    if a.shape != c.shape:
        raise ValueError(f"paired_ratio_shift: {a.size} pairs against {c.size}")
    if b.sum() <= 0 or d.sum() <= 0:
        return None
    r1, r2 = a.sum() / b.sum(), c.sum() / d.sum()
    diff = float(r2 - r1)
    se = None
    if a.size >= 2:
        z = (c - r2 * d) / d.mean() - (a - r1 * b) / b.mean()
        se = float(z.std(ddof=1) / math.sqrt(z.size))
    zscore = diff / se if se else None
    return Shift(int(a.size), float(r1), float(r2), diff, se, zscore)
