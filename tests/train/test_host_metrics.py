"""Hosts that stay in step, on one process: even shares, an empty share that idles, metrics
combined by name over the union of names, and teacher rows through the byte gather's codec."""

import numpy as np
import pytest

from avalon.org.config import OrgConfig
from avalon.org.driver import RolloutDriver
from avalon.rl.types import TrajectoryRow
from avalon.train import host_metrics
from avalon.train.distributed import ProcessInfo, decode_rows, encode_rows, host_shard, share_bounds


@pytest.mark.parametrize("n,hosts", [(200, 32), (3, 4), (0, 2), (7, 1), (8, 8), (9, 2)])
def test_shares_are_even_contiguous_and_cover_every_item(n, hosts):
    items = list(range(n))
    shares = [host_shard(items, ProcessInfo(p, hosts)) for p in range(hosts)]
    assert [x for s in shares for x in s] == items
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger shares first
    assert [share_bounds(n, ProcessInfo(p, hosts))[1] - share_bounds(n, ProcessInfo(p, hosts))[0]
            for p in range(hosts)] == sizes


def test_two_hundred_groups_over_32_hosts_are_7s_and_6s_not_a_tail_of_empty_hosts():
    sizes = [len(host_shard(list(range(200)), ProcessInfo(p, 32))) for p in range(32)]
    assert sizes == [7] * 8 + [6] * 24


def test_an_empty_share_plays_nothing_without_failing():
    result = RolloutDriver(policy=None, chat=None, config=OrgConfig.scaled(512),
                           max_agents=4).run([])
    assert (result.groups, result.logs, result.ticks) == ([], [], [])


def test_means_are_weighted_by_what_each_host_played_over_the_union_of_names():
    a = [1.0, 2.0, 4.0]  # host 0's three rollouts' rewards
    b = [3.0]  # host 1's one
    host0 = {"reward/mean": np.mean(a), "reward/std": np.std(a), "batch/adv_max": 1.5,
             "batch/adv_min": -0.5, "rollouts": 3, "engine/dispatches": 10,
             "org/review_share": 0.5, "time/rollout_s": 2.0, "org/titles": {"CEO": 3, "QA": 1}}
    host1 = {"reward/mean": np.mean(b), "reward/std": np.std(b), "batch/adv_max": 0.7,
             "batch/adv_min": -2.0, "rollouts": 1, "engine/dispatches": 4,
             "org/result_handoffs": 2.0, "time/rollout_s": 5.0, "org/titles": {"CEO": 1}}
    out = host_metrics.combine([(host0, 3.0), (host1, 1.0)])
    union = a + b
    assert out["reward/mean"] == pytest.approx(np.mean(union), rel=1e-12)
    assert out["reward/std"] == pytest.approx(np.std(union), rel=1e-12)
    assert (out["batch/adv_max"], out["batch/adv_min"]) == (1.5, -2.0)
    assert (out["rollouts"], out["engine/dispatches"]) == (4.0, 14.0)
    assert out["time/rollout_s"] == 5.0  # the slowest host
    # A name only one host reports is that host's value, not averaged with a missing zero.
    assert out["org/review_share"] == 0.5 and out["org/result_handoffs"] == 2.0
    assert out["org/titles"] == {"CEO": 4, "QA": 1}


def test_eval_arm_std_pools_with_its_bare_mean_and_the_table_is_by_name():
    out = host_metrics.combine([({"eval/org_reward": 1.0, "eval/org_reward/std": 0.0,
                                  "eval/org_rollouts": 2}, 2.0),
                                ({"eval/org_reward": 3.0, "eval/org_reward/std": 0.0,
                                  "eval/org_rollouts": 2}, 2.0)])
    assert out["eval/org_reward"] == 2.0 and out["eval/org_reward/std"] == pytest.approx(1.0)
    assert out["eval/org_rollouts"] == 4.0
    assert host_metrics.reduction("perf/generated_tokens_per_s") == "sum"
    assert host_metrics.reduction("batch/role/ceo/loss_tokens") == "sum"
    assert host_metrics.reduction("some/new_metric_of_another_environment") == "mean"


def test_one_process_reduces_to_its_own_metrics():
    m = {"reward/mean": 0.25, "x": 3}
    assert host_metrics.reduce_across_hosts(m, weight=7) == m


def test_teacher_rows_survive_the_gather_codec():
    rng = np.random.default_rng(0)
    rows = [TrajectoryRow(tokens=rng.integers(0, 100, 9, dtype=np.int32),
                          loss_mask=rng.random(9) > 0.5,
                          sampler_logp=rng.standard_normal(9).astype(np.float32),
                          routing=rng.integers(0, 8, (9, 2, 3)).astype(np.int16) if i else None,
                          flags=np.zeros(9, np.int8), agent=f"a{i}", role="Lead", segment=i)
            for i in range(3)]
    back, tags = decode_rows(encode_rows(rows, [5, 5, 9]))
    assert tags == [5, 5, 9]
    for r, s in zip(rows, back):
        for name in ("tokens", "loss_mask", "sampler_logp", "flags"):
            np.testing.assert_array_equal(getattr(r, name), getattr(s, name))
            assert getattr(r, name).dtype == getattr(s, name).dtype
        assert (r.routing is None) == (s.routing is None)
        if r.routing is not None:
            np.testing.assert_array_equal(r.routing, s.routing)
        assert (r.agent, r.role, r.segment) == (s.agent, s.role, s.segment)


def test_a_host_that_played_nothing_takes_no_part_in_means_or_extremes():
    played = {"batch/reward_mean": 0.5, "batch/adv_max": 1.0, "batch/groups": 2}
    empty = {"batch/reward_mean": float("nan"), "batch/adv_max": float("-inf"),
             "batch/groups": 0}
    out = host_metrics.combine([(played, 4.0), (empty, 0.0)])
    assert out == {"batch/reward_mean": 0.5, "batch/adv_max": 1.0, "batch/groups": 2.0}
