"""Statistics against hand-enumerated numbers (the numbers are the test; scipy, where
installed, and a brute-force enumeration cross-check them)."""

import itertools
import math

import numpy as np
import pytest

from avalon.analysis.stats import (
    average_ranks,
    bootstrap_mean,
    paired_bootstrap,
    sign_test,
    signed_rank_distribution,
    wilcoxon,
    wilson,
)


def _brute_p(d):
    """Two-sided exact p by listing all 2^n sign flips of the non-zero |d| (average ranks)."""
    d = np.asarray([v for v in d if v != 0], float)
    ranks = average_ranks(np.abs(d))
    w = ranks[d > 0].sum()
    sums = [sum(r for r, s in zip(ranks, signs) if s)
            for signs in itertools.product((0, 1), repeat=len(d))]
    lo = sum(s <= w + 1e-9 for s in sums) / len(sums)
    hi = sum(s >= w - 1e-9 for s in sums) / len(sums)
    return min(1.0, 2 * min(lo, hi))


def test_no_ties_no_zeros():
    # d = 1, 2, 3: W+ = 6; subset sums of {1,2,3} are 0,1,2,3,3,4,5,6: P(W+ >= 6) = 1/8.
    r = wilcoxon([1, 2, 3], [0, 0, 0])
    assert (r.n, r.n_up, r.n_down, r.n_ties, r.w_plus, r.w_minus) == (3, 3, 0, 0, 6.0, 0.0)
    assert r.p_value == 2 / 8 and r.exact


def test_zeros_are_dropped():
    # d = 0, 0, 1, -2, 3, 4 -> ranks 1..4 on 1, 2, 3, 4; W+ = 1 + 3 + 4 = 8. Of the 16 subset
    # sums of {1,2,3,4}, three are >= 8 (8, 9, 10): p = 2 * 3/16.
    x = [5, 5, 1, 0, 3, 4]
    y = [5, 5, 0, 2, 0, 0]
    r = wilcoxon(x, y)
    assert (r.n, r.n_up, r.n_down, r.n_ties, r.w_plus) == (4, 3, 1, 2, 8.0)
    assert r.p_value == 6 / 16


def test_ties_use_the_tied_ranks():
    # |d| = 1, 1, 2, 3 -> ranks 1.5, 1.5, 3, 4; d = +1, +1, -2, +3: W+ = 7. The 16 sums:
    # 0, 1.5, 1.5, 3, 3, 4, 4.5, 4.5, 5.5, 5.5, 6, 7, 7, 8.5, 8.5, 10: five are >= 7.
    r = wilcoxon([1, 1, 0, 3], [0, 0, 2, 0])
    assert r.w_plus == 7.0 and r.w_minus == 3.0
    assert r.p_value == 10 / 16
    assert signed_rank_distribution([1.5, 1.5, 3, 4]) == {
        0: 1, 1.5: 2, 3: 2, 4: 1, 4.5: 2, 5.5: 2, 6: 1, 7: 2, 8.5: 2, 10: 1}


def test_ties_and_a_zero_significant():
    # d = 0, 2, 2, 2, 5, 6, 7, -1: n = 7; ranks 1 (the -1), 3, 3, 3 (the 2s), 5, 6, 7.
    # W- = 1; P(W- <= 1) counts {} and {1}: 2 of 128, so p = 4/128.
    d = [0, 2, 2, 2, 5, 6, 7, -1]
    r = wilcoxon(d, [0] * len(d))
    assert (r.n, r.n_ties, r.w_plus, r.w_minus) == (7, 1, 27.0, 1.0)
    assert r.p_value == 4 / 128


def test_float_noise_neither_makes_nor_breaks_ties():
    r = wilcoxon([0.3, 0.2, 0.5], [0.1, 0.0, 0.5])  # 0.3-0.1 != 0.2 in floats
    assert (r.n, r.n_ties, r.w_plus) == (2, 1, 3.0)  # ranks 1.5, 1.5


def test_nothing_to_test():
    r = wilcoxon([1, 2], [1, 2])
    assert (r.n, r.n_ties, r.p_value) == (0, 2, 1.0)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_enumeration(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=11).astype(float)  # many ties and zeros
    y = rng.integers(0, 4, size=11).astype(float)
    assert math.isclose(wilcoxon(x, y).p_value, _brute_p(x - y), rel_tol=1e-12)


def test_matches_scipy_where_scipy_is_exact():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (5, 9, 14, 20):
        x = rng.normal(size=n) + 0.4
        y = rng.normal(size=n)
        want = scipy_stats.wilcoxon(x, y, method="exact").pvalue
        assert math.isclose(wilcoxon(x, y).p_value, want, rel_tol=1e-9)


def test_large_n_normal_approximation_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, size=40).astype(float)
    y = rng.integers(0, 6, size=40).astype(float)
    r = wilcoxon(x, y)
    assert not r.exact
    want = scipy_stats.wilcoxon(x, y, zero_method="wilcox", correction=True,
                                method="approx").pvalue
    assert math.isclose(r.p_value, want, rel_tol=1e-9)


def test_sign_test():
    # 5 up, 1 down, 1 tie: P(X <= 1) for X ~ Bin(6, 1/2) = 7/64; two-sided 14/64.
    r = sign_test([1, 1, 1, 1, 1, 0, 2], [0, 0, 0, 0, 0, 1, 2])
    assert (r.n_up, r.n_down, r.n_ties) == (5, 1, 1)
    assert r.p_value == 14 / 64


def test_wilson_interval():
    # 3 of 10 at 95%: the textbook (0.1078, 0.6032).
    iv = wilson(3, 10)
    assert iv.estimate == 0.3
    assert round(iv.low, 4) == 0.1078 and round(iv.high, 4) == 0.6032
    assert wilson(0, 10).low == 0.0 and wilson(10, 10).high == 1.0
    with pytest.raises(ValueError, match="successes"):
        wilson(11, 10)


def test_bootstrap_intervals():
    # Resampling [0, 1] twice gives means 0, 0.5, 1 with chances 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% quantiles are 0 and 1.
    iv = bootstrap_mean([0.0, 1.0], resamples=4000)
    assert (iv.estimate, iv.low, iv.high) == (0.5, 0.0, 1.0)
    same = bootstrap_mean([2.0] * 5)
    assert (same.low, same.high) == (2.0, 2.0)
    x = np.arange(30.0)
    d = paired_bootstrap(x + 5.0, x, resamples=500)  # every pair differs by exactly 5
    assert (d.estimate, d.low, d.high) == (5.0, 5.0, 5.0)
    noisy = paired_bootstrap(x + 1.0 + np.sin(x), x, seed=3)
    assert noisy.low < 1.0 + np.sin(x).mean() < noisy.high
    assert paired_bootstrap(x + np.sin(x), x, seed=3) == paired_bootstrap(x + np.sin(x), x,
                                                                          seed=3)
