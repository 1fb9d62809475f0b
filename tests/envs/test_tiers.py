"""Difficulty tiers (avalon/envs/tiers.py) in the toy's three environments: today's tasks stay
at the top (checked against hashes recorded before tiers existed), lower tiers have their own
ids and content, the SFT teacher plays every tier, and the easier tiers are easier by each
environment's own scripted baselines."""

import json

import numpy as np
import pytest

from avalon.envs.base import Split, UnknownTaskError, split_of
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig, best_option, scores
from avalon.envs.hidden_profile.teacher import facts_in
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.tiers import tier_task_ids
from avalon.envs.verification import Verification, VerificationConfig
from avalon.org import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from avalon.tools.env_baselines import run
from configs import toy_org
from tests.envs import tier_content
from tests.envs.helpers import environment, run_teacher, totals, word_chat
from tests.org.golden import _toy

TIERED = tier_content.toy_environments(toy_org.SMALL_MODEL_TIERS)


def test_one_tier_environments_keep_todays_tasks():
    pinned = json.loads(tier_content.PINNED.read_text())
    assert tier_content.digests(tier_content.toy_environments()) == pinned["toy"]
    assert tier_content.digests(tier_content.default_environments()) == pinned["default"]


def test_the_top_tier_is_todays_tasks():
    pinned = json.loads(tier_content.PINNED.read_text())
    assert [e.n_tiers for e in TIERED] == [4, 4, 4]
    assert tier_content.digests(TIERED) == pinned["toy"]
    for env in TIERED:  # today's held-out tasks come first, so evaluation's first N are they
        top = env.tier_task_ids(Split.HELDOUT, env.n_tiers - 1)
        assert env.task_ids(Split.HELDOUT)[:len(top)] == top
        assert top[0] == f"{env.name}-heldout-0"


def test_lower_tiers_have_their_own_ids_and_content():
    for env in TIERED:
        seen = set()
        for split in Split:
            per_tier = tier_task_ids(env, split)
            assert sum(len(ids) for ids in per_tier) == len(env.task_ids(split))
            assert set().union(*per_tier) == set(env.task_ids(split))
            for t, ids in enumerate(per_tier):
                if t < env.n_tiers - 1:
                    assert ids[3] == f"{env.name}-t{t}-{split.value}-3"
                for task_id in ids[:8]:
                    assert split_of(task_id) is split and env.tier_of(task_id) == t
                    assert env.task(task_id).task_id == task_id
                    seen.add(task_id)
        assert len(seen) == 8 * 2 * env.n_tiers
        for t in range(env.n_tiers):  # each tier keeps its held-out content apart from its train
            sig = env.tasks.tables[t].signature
            train = {sig(env.spec(i)) for i in env.tier_task_ids(Split.TRAIN, t)}
            held = [sig(env.spec(i)) for i in env.tier_task_ids(Split.HELDOUT, t)]
            assert not train & set(held) and len(set(held)) == len(held)
    with pytest.raises(UnknownTaskError, match="environment 'parallel' has no task "
                                               "'parallel-t7-train-0'"):
        TIERED[0].session("parallel-t7-train-0", 0)
    with pytest.raises(UnknownTaskError, match="has no task 'parallel-t0-train-512'"):
        TIERED[0].tier_of("parallel-t0-train-512")  # the tier's own n_train (512) bounds it
    with pytest.raises(ValueError, match=r"parallel: tier must be an int in 0..3, got 4"):
        TIERED[0].tier_task_ids(Split.TRAIN, 4)


def test_a_tier_draws_from_its_own_stream_under_its_own_config():
    # a tier with no overrides: today's config, but its own random stream (other tasks)
    env = ParallelSubtasks(ParallelConfig(n_train=16, n_heldout=4), tiers=({},))
    same = [env.spec(f"parallel-t0-train-{i}") for i in range(16)]
    top = [env.spec(f"parallel-train-{i}") for i in range(16)]
    assert all(a != b for a, b in zip(same, top))
    easy = ParallelSubtasks(ParallelConfig(n_train=16, n_heldout=4),
                            tiers=({"n_subtasks": (1, 1), "clock_s": 90.0},))
    assert all(len(easy.spec(f"parallel-t0-train-{i}").subtasks) == 1 for i in range(16))
    assert easy.task("parallel-t0-train-0").wall_clock_s == 90.0  # the tier's clock
    assert easy.task("parallel-train-0").wall_clock_s == 300.0
    assert easy.task("parallel-t0-train-0", clock_s=45.0).wall_clock_s == 45.0


@pytest.mark.parametrize("make, tiers, message", [
    (lambda t: ParallelSubtasks(ParallelConfig(), tiers=t), ({"unit_s": 30.0},),
     "ParallelConfig tier t0: ['unit_s'] cannot vary by tier; a tier sets ['check_answers', "),
    (lambda t: ParallelSubtasks(ParallelConfig(), tiers=t), ({}, {"dep_prob": 2.0}),
     "ParallelConfig tier t1: ParallelConfig.dep_prob=2.0: must be in [0, 1]"),
    (lambda t: HiddenProfile(ProfileConfig(), tiers=t), ({"n_options": 4},),
     "ProfileConfig tier t0: ProfileConfig.n_options=4: must be 2 or 3"),
    (lambda t: Verification(VerificationConfig(), tiers=t), ("n_items",),
     "VerificationConfig tier t0: must be a mapping of fields, got 'n_items'"),
    (lambda t: Verification(VerificationConfig(), tiers=t), {"n_items": (1, 2)},
     "VerificationConfig tiers: must be a sequence of mappings"),
])
def test_bad_tiers_are_one_line_naming_the_tier_and_field(make, tiers, message):
    with pytest.raises(ValueError) as e:
        make(tiers)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_toy_config_reads_tiers_from_its_env_section():
    env = toy_org.get_config().env
    env.three_environments = True
    env.parallel_tiers = ({"n_subtasks": [1, 2], "ops": ["add"]},)  # as a command line gives
    parallel = toy_org.make_environments(env)[0]
    spec = parallel.tier_config(0)
    assert spec.n_subtasks == (1, 2) and [o.value for o in spec.ops] == ["add"]
    assert parallel.tier_config(1).n_subtasks == (4, 6)  # the top: the toy's own
    env.verification_tiers = ({"review_s": 1.0},)
    with pytest.raises(ValueError, match=r"^VerificationConfig tier t0: \['review_s'\] cannot"):
        toy_org.make_environments(env)


@pytest.mark.parametrize("n_options", [2, 3])
@pytest.mark.parametrize("holders", [0, 1, 2, 3, 4])
def test_hidden_profile_construction_at_every_size(n_options, holders):
    env = HiddenProfile(ProfileConfig(n_train=300, n_heldout=8),
                        tiers=({"n_options": n_options, "n_holders": (holders, holders)},))
    shared_right = 0
    ids = env.tier_task_ids(Split.TRAIN, 0)
    for task_id in ids:
        spec, prompt = env.spec(task_id), env.task(task_id).prompt
        assert len(spec.options) == n_options and len(spec.held) == holders
        assert set(facts_in(prompt, spec.options)) == set(spec.shared)
        pooled = list(spec.shared) + [f for h in spec.held for f in h]
        top = sorted(scores(spec.options, pooled).values())
        assert best_option(spec.options, pooled) == spec.answer and top[-1] > top[-2]
        shared_right += best_option(spec.options, spec.shared) == spec.answer
        said = {0: "Known:", 1: "1 analyst holds more facts."}.get(
            holders, f"{holders} analysts each hold more facts.")
        assert said in prompt and (holders == 1) == ("analyst holds" in prompt)
    # the single agent's chance on the shared facts: 1 with no analyst, else the answer's share
    # of the top shared score (one of two options, or one of three)
    expected = 1.0 if holders == 0 else 1 / n_options
    assert abs(shared_right / len(ids) - expected) < 4 * np.sqrt(expected * (1 - expected)
                                                                 / len(ids)) + 1e-9


def test_sft_teacher_makes_traces_at_every_tier():
    org, chat, _, make_teacher = _toy()  # the toy's organisation settings and word tokenizer
    for env in TIERED:
        for t in range(env.n_tiers):
            ids = env.tier_task_ids(Split.TRAIN, t)[:6]
            policy = make_teacher(env, chat)  # the toy's imperfect SFT teacher
            groups = [GroupSpec(i, (RolloutSpec(env.session(task_id, 7 + i), 3, 7 + i),))
                      for i, task_id in enumerate(ids)]
            result = RolloutDriver(policy, chat, org).run(groups)
            assert policy.cut_turns == 0, (env.name, t)
            for group in result.groups:
                assert any(r.loss_mask.any() for r in group.rollouts[0].rows), (env.name, t)
            assert totals(result).mean() > 0, (env.name, t)


def test_easier_tiers_are_easier_by_the_scripted_baselines():
    table = run(toy_org.get_config("tiers"), Split.HELDOUT, 12, by_tier=True)
    for env, tiers in table.items():
        names = list(tiers)
        assert names == ["t0", "t1", "t2", "t3"]
        single = [tiers[t]["single"]["success"] for t in names]
        chance = [tiers[t]["chance"]["success"] for t in names]
        assert single[0] == 1.0, env  # the easiest tier: a scripted single agent solves it
        assert all(s > single[-1] for s in single[:-1]), (env, single)
        assert chance[0] >= chance[-1], (env, chance)
        assert tiers["t3"]["org"]["success"] > single[-1], env  # the top needs the organisation


def test_a_lower_tier_is_served_over_ors_like_any_task():
    local = ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2),
                             tiers=({"n_subtasks": (1, 1), "dep_prob": 0.0},))
    with environment(local, "ors") as remote:
        assert remote.task_ids(Split.TRAIN) == local.task_ids(Split.TRAIN)
        task_id = "parallel-t0-train-2"
        assert remote.task(task_id).prompt == local.task(task_id).prompt
        [sub] = local.spec(task_id).subtasks
        chat = word_chat(local)
        steps = {"ceo": [Step("Plan: solve s1."),  # plan mode: no work in the first turn
                         Step("", (("solve", {"id": "s1", "answer": sub.answer}),))]}
        result = run_teacher(ScriptedPolicy(chat, Playbook(steps)), chat,
                             [remote.session(task_id, 0)], [0])
        assert totals(result).tolist() == [1.0]
