"""Environment 2, hidden profile: the construction, rewards, hardening and the teacher, in-process
and over HTTP."""

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.hidden_profile import CHOOSE, HiddenProfile, ProfileConfig, best_option
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


def test_only_pooling_every_holder_identifies_the_answer():
    for tid in LOCAL.task_ids(Split.TRAIN) + LOCAL.task_ids(Split.HELDOUT):
        spec = LOCAL.spec(tid)
        prompt = LOCAL.task(tid).prompt
        shared = facts_in(prompt, spec.options)
        assert set(shared) == set(spec.shared)  # the prompt states exactly the shared facts
        assert best_option(spec.options, shared) == spec.decoy != spec.answer
        for k in range(len(spec.held)):  # any k < m holders: still the decoy
            partial = shared + [f for h in spec.held[:k] for f in h]
            assert best_option(spec.options, partial) == spec.decoy
        pooled = shared + [f for h in spec.held for f in h]
        assert best_option(spec.options, pooled) == spec.answer


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


def test_choose_rewards_the_answer_once(env):
    tid = env.task_ids(Split.TRAIN)[3]
    spec = LOCAL.spec(tid)
    d = Direct(env, tid)
    with pytest.raises(ToolError, match="no option 'zzz'"):
        d.call("choose", option="zzz")
    out = d.call("choose", option=spec.answer.upper())
    assert out.terminal and [(r.value, r.label) for r in out.rewards] == [(1.0, "correct")]
    # Hack: try every option. One choice per session.
    with pytest.raises(ToolError, match="already chose"):
        d.call("choose", option=spec.decoy)
    assert d.end().metrics == {"chose": 1.0, "correct": 1.0}
    d = Direct(env, tid)
    assert d.call("choose", option=spec.decoy).rewards == ()
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


def test_constant_positions_and_shared_facts_score_at_chance_or_worse():
    ids = LOCAL.task_ids(Split.TRAIN)
    specs = [LOCAL.spec(t) for t in ids]
    for pos in range(3):  # hack: always pick the option at a fixed position
        share = np.mean([s.options[pos] == s.answer for s in specs])
        assert 0.2 < share < 0.47, (pos, share)
    # Hack: trust the facts everyone already knows: always wrong by construction.
    assert not any(best_option(s.options, s.shared) == s.answer for s in specs)


def test_teacher_pools_facts_on_heldout_tasks(env):
    ids = env.task_ids(Split.HELDOUT)
    m = [len(LOCAL.spec(t).held) for t in ids]
    policy = LOCAL.teacher(BYTES)
    full = run_teacher(policy, BYTES, [env.session(t, 0) for t in ids], [3] * len(ids))
    assert totals(full).tolist() == [1.0] * len(ids)  # every holder hired: always right
    assert policy.cut_turns == 0
    short = run_teacher(LOCAL.teacher(BYTES), BYTES, [env.session(t, 0) for t in ids],
                        [k - 1 for k in m])
    assert totals(short).tolist() == [0.0] * len(ids)  # one holder short: always the decoy
    hires = [g.rollouts[0].hires for g in full.groups]
    assert hires == m
