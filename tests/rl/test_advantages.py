"""Collective rewards, group-relative advantages, shaping, GKPO's utility."""

import numpy as np
import pytest

from avalon.rl.advantages import gkpo_utility, score_groups, token_advantages
from avalon.rl.build import build_rl_batch
from avalon.rl.config import GroupFilter, RLConfig
from avalon.rl.types import Objective, TokenFlag
from tests.rl.helpers import make_group, make_rollout, make_row

CFG = RLConfig(underhire_slope=0.25)


# ---- GKPO's utility ------------------------------------------------------------------------
X = np.array([0.0, 1e-30, 1e-6, 0.01, 0.3, 1.0, 1.7, 10.0, 1e6], np.float32)


def test_gkpo_tends_to_log_as_beta_goes_to_zero():
    # u - log x = beta (log x)^2 / 2 + ...: 2.4e-6 at x = 1e-30, beta = 1e-9.
    for beta in (1e-9, 1e-12, 1e-30, 0.0):
        u = np.asarray(gkpo_utility(X[1:], beta))
        np.testing.assert_allclose(u, np.log(X[1:].astype(np.float64)), rtol=1e-6, atol=1e-6)


def test_gkpo_is_risk_neutral_at_one():
    np.testing.assert_allclose(gkpo_utility(X, 1.0), X.astype(np.float64) - 1, rtol=1e-6)


@pytest.mark.parametrize("beta", [0.05, 0.2582, 0.5, 1.0, 2.0])
def test_gkpo_bounded_below_and_finite_at_ruin(beta):
    u = np.asarray(gkpo_utility(X, beta))
    assert np.isfinite(u).all()
    assert (u >= np.float32(-1.0 / beta)).all()
    np.testing.assert_allclose(u[0], -1.0 / beta, rtol=1e-6)  # ruin: exactly the bound
    assert (np.diff(u) >= 0).all()  # non-decreasing in wealth (float32 saturates near 0)
    ref = (X[1:].astype(np.float64) ** beta - 1) / beta
    np.testing.assert_allclose(u[1:], ref, rtol=1e-5, atol=1e-6)


def test_gkpo_default_beta_bound():
    assert float(gkpo_utility(0.0, RLConfig().beta)) == pytest.approx(-3.873, abs=1e-3)


# ---- rewards and group normalisation ---------------------------------------------------------
def _rows(rng, n_agents, length=12):
    return [make_row(rng, length, agent=a) for a in ["ceo", "a1", "a2", "a3", "a4"][:n_agents]]


def test_collective_reward_sums_every_agent_and_normalises_per_group():
    rng = np.random.default_rng(0)
    rewards = [[1.0, 0.5], [0.25], [2.0, -1.0, 0.5]]  # events on different agents
    rollouts = [make_rollout(_rows(rng, n), r) for n, r in zip([1, 4, 2], rewards)]
    scored, stats = score_groups([make_group(7, rollouts)], CFG)
    r = np.array([1.5, 0.25, 1.5])
    np.testing.assert_allclose(scored[0].rewards, r)
    np.testing.assert_allclose(scored[0].advantages, (r - r.mean()) / r.std(ddof=0))
    assert (stats.groups, stats.kept_groups, stats.dropped_groups) == (1, 1, 0)


def test_underhire_penalty_is_linear_in_unused_budget_before_normalisation():
    rng = np.random.default_rng(1)
    ros = [make_rollout(_rows(rng, 1), [v], budget=b, hires=h)
           for v, (b, h) in zip([1.0, 1.0, 0.0, 1.0], [(0, 0), (4, 1), (8, 8), (2, 5)])]
    scored, _ = score_groups([make_group(0, ros)], CFG)
    r = np.array([1.0, 1.0, 0.0, 1.0]) - 0.25 * np.array([0, 3, 0, 0])
    np.testing.assert_allclose(scored[0].rewards, r)
    np.testing.assert_allclose(scored[0].raw, [1.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(scored[0].advantages, (r - r.mean()) / r.std())


def test_a_group_that_scored_alike_is_dropped_whatever_its_penalties():
    """Raw filter (default): every rollout scored 0 (or all the same), the budgets differ, so
    the penalised rewards differ: still dropped, no advantage and no shaping for it. The
    shaped filter (the earlier reading) keeps it on the penalty's spread."""
    rng = np.random.default_rng(1)
    budgets = [(0, 0), (3, 0), (2, 1), (3, 3)]
    zero = make_group(0, [make_rollout(_rows(rng, 1), [0.0], budget=b, hires=h)
                          for b, h in budgets])
    ones = make_group(1, [make_rollout(_rows(rng, 1), [1.0], budget=b, hires=h)
                          for b, h in budgets])
    scored, stats = score_groups([zero, ones], CFG)
    assert [g.advantages for g in scored] == [None, None]
    assert (stats.dropped_all_zero, stats.dropped_all_equal, stats.kept_groups) == (1, 1, 0)
    assert stats.raw_reward_mean == 0.5 and stats.reward_mean < 0.5
    batch, bstats = build_rl_batch([zero, ones], CFG, seq_len=64)
    assert bstats.packing.rows == 0 and not batch.loss_mask.any()
    shaped, stats = score_groups([zero, ones], CFG.replace(group_filter=GroupFilter.SHAPED))
    assert stats.kept_groups == 2
    r = -0.25 * np.array([0, 3, 1, 0])
    np.testing.assert_allclose(shaped[0].advantages, (r - r.mean()) / r.std())


def test_zero_variance_and_singleton_groups_are_dropped_and_counted():
    rng = np.random.default_rng(2)
    same = make_group(0, [make_rollout(_rows(rng, 2), [0.5]) for _ in range(4)])
    single = make_group(1, [make_rollout(_rows(rng, 1), [3.0])])
    # std 1e-9 is below the tolerance 1e-6: numerically a tie, dropped too.
    near = make_group(2, [make_rollout(_rows(rng, 1), [1.0 + d]) for d in (0, 1e-9, 2e-9)])
    live = make_group(3, [make_rollout(_rows(rng, 1), [v]) for v in (0.0, 1.0)])
    scored, stats = score_groups([same, single, near, live], CFG)
    assert [g.advantages is None for g in scored] == [True, True, True, False]
    assert (stats.kept_groups, stats.dropped_groups, stats.rollouts) == (1, 3, 2)
    batch, bstats = build_rl_batch([same, single, near, live], CFG, seq_len=64)
    assert bstats.packing.rows == 2  # only the live group's two rows are packed
    assert bstats.as_metrics()["dropped_groups"] == 3


def test_groups_are_keyed_by_explicit_index_not_position():
    rng = np.random.default_rng(3)
    part1 = make_group(5, [make_rollout(_rows(rng, 1), [v]) for v in (0.0, 1.0)])
    other = make_group(6, [make_rollout(_rows(rng, 3), [v]) for v in (5.0, 7.0, 9.0)])
    part2 = make_group(5, [make_rollout(_rows(rng, 2), [v]) for v in (2.0, 3.0)])
    scored, stats = score_groups([part1, other, part2], CFG)
    assert [g.group_id for g in scored] == [5, 6]
    r = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(scored[0].advantages, (r - r.mean()) / r.std())
    bad = make_group(5, [make_rollout(_rows(rng, 1), [1.0])])
    bad.task_id = "another"
    with pytest.raises(ValueError, match="group_id=5"):
        score_groups([part1, bad], CFG)


def test_gkpo_objective_uses_the_wealth_ratio():
    rng = np.random.default_rng(4)
    ros = [make_rollout(_rows(rng, 1), [99.0], wealth_ratio=w) for w in (0.0, 1.0, 2.5)]
    scored, _ = score_groups([make_group(0, ros, objective=Objective.GKPO)], CFG)
    b = CFG.beta
    r = np.array([-1 / b, 0.0, (2.5 ** b - 1) / b])  # reward events ignored
    np.testing.assert_allclose(scored[0].rewards, r, rtol=1e-6)
    missing = make_group(1, [make_rollout(_rows(rng, 1), [1.0])], objective=Objective.GKPO)
    with pytest.raises(ValueError, match="wealth_ratio=None"):
        score_groups([missing], CFG)


def test_non_finite_reward_is_a_clear_error():
    rng = np.random.default_rng(5)
    g = make_group(0, [make_rollout(_rows(rng, 2), [1.0, float("nan")])])
    with pytest.raises(ValueError, match=r"RewardEvent.value=nan \(agent 'a1', seq 1\)"):
        score_groups([g], CFG)


# ---- per-token advantages --------------------------------------------------------------------
def test_shaping_lands_only_on_its_own_turns_tokens():
    row = make_row(np.random.default_rng(6), 20, loss_frac=1.0)
    row.loss_mask[[0, 9, 15]] = False  # the prompt, a tool result, a received message
    row.flags[3:7] = TokenFlag.MALFORMED
    row.flags[11:14] = TokenFlag.TOOL_ERROR
    row.flags[15] = TokenFlag.TOOL_ERROR  # off the mask: no loss, so no shaping either
    adv = token_advantages(row, 0.75, CFG)
    want = np.full(20, 0.75)
    want[3:7] += -0.1
    want[11:14] += -0.05
    want[[0, 9, 15]] = 0.0
    np.testing.assert_allclose(adv, want, rtol=1e-6)
    row.flags[2] = 7
    with pytest.raises(ValueError, match="flags has unknown value 7"):
        token_advantages(row, 0.75, CFG)


def test_every_loss_token_of_every_agent_carries_its_rollouts_advantage():
    """Uneven agent counts (1, 4, 2, 3 rows), packed together: read A back from the batch."""
    rng = np.random.default_rng(7)
    rollouts = []
    for i, (n_agents, reward) in enumerate(zip([1, 4, 2, 3], [0.0, 1.0, 3.0, 0.5])):
        rows = [make_row(rng, int(rng.integers(4, 30)), agent=f"a{j}", fill_token=10 + i)
                for j in range(n_agents)]
        rollouts.append(make_rollout(rows, [reward]))
    scored, _ = score_groups([make_group(0, rollouts)], CFG)
    batch, stats = build_rl_batch([make_group(0, rollouts)], CFG, seq_len=48)
    assert stats.packing.rows == 10
    for i, a in enumerate(scored[0].advantages):
        own = (batch.targets == 10 + i) & batch.loss_mask
        want = sum(int(r.loss_mask[1:].sum()) for r in rollouts[i].rows)
        assert own.sum() == want  # every sampled token of every agent of rollout i
        np.testing.assert_allclose(batch.advantages[own], a, rtol=1e-6)
    np.testing.assert_array_equal(batch.advantages[~batch.loss_mask], 0.0)


def test_rollout_without_loss_tokens_still_counts_in_its_group():
    """Its reward shapes the group's mean and std; it just has nothing to train on."""
    rng = np.random.default_rng(8)
    silent = make_rollout([make_row(rng, 9, loss_frac=0.0)], [0.0])
    others = [make_rollout(_rows(rng, 2), [v]) for v in (1.0, 2.0)]
    group = make_group(0, [silent, *others])
    scored, _ = score_groups([group], CFG)
    r = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(scored[0].advantages, (r - r.mean()) / r.std())
    batch, stats = build_rl_batch([group], CFG, seq_len=32)
    assert (stats.packing.rows, stats.packing.skipped_rows) == (4, 1)


def test_skipped_turns_carry_no_advantage_and_no_loss():
    from avalon.rl.build import build_rl_batch
    rng = np.random.default_rng(16)
    rows = [make_row(rng, 24, loss_frac=1.0), make_row(rng, 24, loss_frac=1.0)]
    rows[0].flags[5:12] = TokenFlag.SKIPPED
    adv = token_advantages(rows[0], 0.5, CFG)
    assert (adv[5:12] == 0).all() and (adv[1:5] == 0.5).all() and (adv[12:] == 0.5).all()
    group = make_group(0, [make_rollout(rows[:1], [1.0]), make_rollout(rows[1:], [0.0])])
    batch, _ = build_rl_batch([group], CFG, seq_len=64)
    assert int(batch.loss_mask.sum()) == 23 - 7 + 23  # targets: each row less its first token
