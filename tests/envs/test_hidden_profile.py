"""Environment 2, hidden profile: the construction, rewards, hardening and the teacher, in-process
and over ORS (the Avalon extension)."""

import itertools

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.hidden_profile import (
    CHOOSE,
    HiddenProfile,
    ProfileConfig,
    best_option,
    scores,
)
from avalon.envs.hidden_profile.teacher import facts_in
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.wealth import Wealth, WealthConfig
from avalon.org.env import ToolError
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from tests.envs.helpers import BYTES, MODES, Direct, environment, run_teacher, totals

LOCAL = HiddenProfile(ProfileConfig(n_train=256, n_heldout=16))


@pytest.fixture(scope="module", params=MODES)
def env(request):
    with environment(LOCAL, request.param) as e:
        yield e


def test_pooling_every_brief_identifies_the_answer():
    partial_right = partial_n = 0
    for tid in LOCAL.task_ids(Split.TRAIN) + LOCAL.task_ids(Split.HELDOUT):
        spec = LOCAL.spec(tid)
        prompt = LOCAL.task(tid).prompt
        shared = facts_in(prompt, spec.options)
        assert set(shared) == set(spec.shared)  # the prompt states exactly the shared facts
        assert sorted(scores(spec.options, shared).values()) == [-1, 0, 1]
        pooled = shared + [f for h in spec.held for f in h]
        totals_ = sorted(scores(spec.options, pooled).values())
        assert best_option(spec.options, pooled) == spec.answer and totals_[2] > totals_[1]
        for k in range(1, len(spec.held)):  # proper subsets of the holders
            for sub in itertools.combinations(spec.held, k):
                partial = shared + [f for h in sub for f in h]
                partial_right += best_option(spec.options, partial) == spec.answer
                partial_n += 1
    assert partial_right / partial_n < 0.6  # a subset of the briefs is a poor guide


def _ranking_rules():
    """Fixed rules that pick an option from the shared facts (and the prompt order) alone."""
    def by(key, reverse):
        return lambda spec: sorted(spec.options, key=lambda o: key(spec, o), reverse=reverse)[0]

    def score(spec, o):
        return scores(spec.options, spec.shared)[o]

    def count(kind):
        return lambda spec, o: sum(f.option == o and kind(f) for f in spec.shared)

    def position(i):
        return lambda spec: spec.options[i]

    rules = {f"position {i}": position(i) for i in range(3)}
    for name, key in (("score", score), ("facts", count(lambda f: True)),
                      ("good facts", count(lambda f: f.good)),
                      ("bad facts", count(lambda f: not f.good))):
        rules[f"most {name}"] = by(key, True)
        rules[f"fewest {name}"] = by(key, False)
    rules["middle score"] = lambda spec: sorted(spec.options, key=lambda o: score(spec, o))[1]
    return rules


def test_leak_probe_shared_facts_score_at_chance():
    # Hack: answer from what everyone already knows. Over 1,000 tasks every fixed ranking rule
    # on the shared facts scores within 0.05 of chance (1/3), and the answer's rank on them is
    # uniform.
    probe = HiddenProfile(ProfileConfig(n_train=1000, n_heldout=1, seed=3))
    specs = [probe.spec(t) for t in probe.task_ids(Split.TRAIN)]
    for name, rule in _ranking_rules().items():
        share = np.mean([rule(s) == s.answer for s in specs])
        assert abs(share - 1 / 3) < 0.05, (name, share)
    ranks = [sorted(s.options, key=lambda o: -scores(s.options, s.shared)[o]).index(s.answer)
             for s in specs]
    assert all(abs(np.mean(np.array(ranks) == r) - 1 / 3) < 0.05 for r in range(3))


def test_briefs_deal_each_holder_to_successive_hires(env):
    tid = env.task_ids(Split.HELDOUT)[0]
    spec = LOCAL.spec(tid)
    d = Direct(env, tid)
    m = len(spec.held)
    assert d.session.brief("ceo", 0, "CEO", "") == ""
    briefs = [d.session.brief(f"a{i}", i, "Analyst", "r") for i in range(1, m + 2)]
    for i, text in enumerate(briefs[:m]):
        assert set(facts_in(text, spec.options)) == set(spec.held[i])
    assert briefs[m] == briefs[0]  # more hires than holders: the deal repeats
    d.end()


def test_a_hire_on_a_task_nobody_holds_facts_in_gets_an_empty_brief():
    """The easiest tier deals no analyst a fact (n_holders 0): a hire there is briefed with
    nothing, where it once divided by the number of holders and ended the RLCR step."""
    local = HiddenProfile(ProfileConfig(n_holders=(0, 0), n_options=2, n_train=8, n_heldout=4))
    tid = local.task_ids(Split.TRAIN)[0]
    assert local.spec(tid).held == ()
    d = Direct(local, tid)
    assert [d.session.brief(f"a{i}", i, "Analyst", "r") for i in (1, 2)] == ["", ""]
    d.end()


def test_choose_rewards_the_answer_once(env):
    tid = env.task_ids(Split.TRAIN)[3]
    spec = LOCAL.spec(tid)
    d = Direct(env, tid)
    with pytest.raises(ToolError, match="no option 'zzz'"):
        d.call("choose", option="zzz")
    out = d.call("choose", option=spec.answer.upper())
    assert out.terminal and [(r.value, r.label) for r in out.rewards] == [(1.0, "correct")]
    # Hack: try every option. One choice per session.
    wrong = next(o for o in spec.options if o != spec.answer)
    with pytest.raises(ToolError, match="already chose"):
        d.call("choose", option=wrong)
    assert d.end().metrics == {"chose": 1.0, "correct": 1.0}
    d = Direct(env, tid)
    assert d.call("choose", option=wrong).rewards == ()
    assert d.end().metrics["correct"] == 0.0


def test_final_tools_cannot_be_granted_to_specialists():
    # Hack: let a specialist answer (or bet, or submit). The CEO keeps these tools: the
    # organisation refuses to grant them at hire.
    envs = [(LOCAL, "choose"), (Wealth(WealthConfig(n_train=2, n_heldout=1)), "bet"),
            (SoftwareBuild(SoftwareConfig(n_train=2, n_heldout=1)), "submit")]
    assert CHOOSE.grantable is False
    for env, tool in envs:
        steps = {"ceo": [Step("", (("hire", {"title": "X", "role": "r", "tools": [tool]}),)),
                         Step("", (("final_message", {"text": "done"}),))]}
        result = run_teacher(ScriptedPolicy(BYTES, Playbook(steps)), BYTES,
                             [env.session(env.task_ids(Split.TRAIN)[0], 0)], [2])
        hire = [e for e in result.logs[0][0].events if e["kind"] == "tool_call"][0]
        assert hire["error"] and f"cannot grant {tool!r}" in hire["result"]
        assert result.groups[0].rollouts[0].hires == 0


def test_teacher_pools_facts_on_heldout_tasks(env):
    ids = env.task_ids(Split.HELDOUT)
    m = [len(LOCAL.spec(t).held) for t in ids]
    policy = LOCAL.teacher(BYTES)
    full = run_teacher(policy, BYTES, [env.session(t, 0) for t in ids], [3] * len(ids))
    assert totals(full).tolist() == [1.0] * len(ids)  # every holder hired: always right
    assert policy.cut_turns == 0
    short = run_teacher(LOCAL.teacher(BYTES), BYTES, [env.session(t, 0) for t in ids],
                        [k - 1 for k in m])
    assert totals(short).mean() < 0.6  # one holder short: right little more than by chance
    hires = [g.rollouts[0].hires for g in full.groups]
    assert hires == m
