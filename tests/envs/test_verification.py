"""Environment 5, collective verification: defects, reviews, shipping, the per-hack hardening,
and the teacher (a verifier pays; a silent team cannot use one), in-process and over ORS."""

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.verification import SHIP, Verification, VerificationConfig, VerifyTeacherConfig
from avalon.org.env import ToolError
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from tests.envs.helpers import BYTES, MODES, Direct, environment, run_teacher, totals, word_chat

LOCAL = Verification(VerificationConfig(n_train=64, n_heldout=24))


@pytest.fixture(scope="module", params=MODES)
def env(request):
    with environment(LOCAL, request.param) as e:
        yield e


def _build_until(d, item, defective, agent="a1"):
    """Builds `item` until a build with the wanted defect state (checked by a review from
    someone else); returns its code."""
    for _ in range(64):
        code = d.call("build", agent=agent, id=item).text.split()[-1]
        verdict = d.call("review", agent="a9", id=item, result=code).text.split()[-1]
        if (verdict == "defect") == defective:
            return code
    raise AssertionError("no such build")


def test_builds_reviews_and_shipping(env):
    tid = env.task_ids(Split.TRAIN)[0]
    spec = LOCAL.spec(tid)
    d = Direct(env, tid)
    out = d.call("build", agent="a1", id="p1")
    code = out.text.split()[-1]
    assert out.text == f"p1 built {code}" and out.duration_s == spec.units[0] * 40.0
    assert not out.rewards
    review = d.call("review", agent="a2", id="p1", result=code)
    assert review.text in (f"p1 {code} ok", f"p1 {code} defect") and review.duration_s == 20.0
    sound = _build_until(d, "p1", defective=False)
    shipped = d.call("ship", id="p1", result=sound)
    assert [(r.value, r.label) for r in shipped.rewards] == [(1.0, "shipped")]
    with pytest.raises(ToolError, match="already shipped"):  # hack: ship twice
        d.call("ship", id="p1", result=code)
    bad = _build_until(d, "p2", defective=True)
    assert [(r.value, r.label) for r in d.call("ship", id="p2", result=bad).rewards] == [
        (-2.0, "defect")]
    m = d.end().metrics
    assert m["shipped"] == 2 and m["shipped_defects"] == 1 and m["reviews"] >= 2


def test_self_review_finds_nothing(env):
    # Hack: check your own work. Only another agent's review sees a defect.
    tid = env.task_ids(Split.TRAIN)[1]
    d = Direct(env, tid)
    bad = _build_until(d, "p1", defective=True, agent="a1")
    out = d.call("review", agent="a1", id="p1", result=bad)
    assert out.text == f"p1 {bad} no defect found (own work)" and out.duration_s == 20.0
    assert d.call("review", agent="ceo", id="p1", result=bad).text.endswith("defect")
    m = d.end().metrics
    assert m["self_reviews"] == 1


def test_guessed_codes_close_the_item(env):
    # Hack: ship (or review) a guessed result code without building or being told one. A code
    # that was never built is an error and counts; after two the item closes, even to the truth.
    tid = env.task_ids(Split.TRAIN)[2]
    d = Direct(env, tid)
    code = d.call("build", agent="a1", id="p1").text.split()[-1]
    wrong = next(str(c) for c in range(10, 100) if str(c) != code)
    with pytest.raises(ToolError, match="has no result"):
        d.call("review", agent="a2", id="p1", result=wrong)
    with pytest.raises(ToolError, match="has no result"):
        d.call("ship", id="p1", result=wrong)
    with pytest.raises(ToolError, match="closed"):
        d.call("ship", id="p1", result=code)
    d.end()


def test_constant_codes_do_not_pay():
    # Hack: ship every item with a fixed code, never building: nothing ships.
    earned = 0.0
    for tid in LOCAL.task_ids(Split.TRAIN):
        d = Direct(LOCAL, tid)
        for i in range(len(LOCAL.spec(tid).units)):
            for _ in range(3):
                try:
                    earned += sum(r.value for r in d.call("ship", id=f"p{i + 1}",
                                                          result="42").rewards)
                except ToolError:
                    pass
        d.end()
    assert earned == 0.0


def test_defects_depend_on_seed_task_and_build_count_only():
    tid = LOCAL.task_ids(Split.TRAIN)[3]

    def verdicts(seed, order):
        d = Direct(LOCAL, tid, seed=seed)
        out = {}
        for item in order:
            code = d.call("build", agent="a1", id=item).text.split()[-1]
            out[item] = (code, d.call("review", agent="a2", id=item, result=code).text)
        d.end()
        return out

    items = [f"p{i + 1}" for i in range(len(LOCAL.spec(tid).units))]
    assert verdicts(5, items) == verdicts(5, items[::-1])  # call order changes nothing
    draws = [verdicts(s, items) for s in range(20)]
    assert len({tuple(sorted(v.items())) for v in draws}) > 10  # the seed does
    rate = LOCAL.spec(tid).defect_rate
    share = np.mean([v[i][1].endswith("defect") for v in draws for i in items])
    assert abs(share - rate) < 0.2


def test_ship_stays_with_the_ceo():
    assert SHIP.grantable is False
    steps = {"ceo": [Step("", (("hire", {"title": "X", "role": "r", "tools": ["ship"]}),)),
                     Step("", (("final_message", {"text": "done"}),))]}
    result = run_teacher(ScriptedPolicy(BYTES, Playbook(steps)), BYTES,
                         [LOCAL.session(LOCAL.task_ids(Split.TRAIN)[0], 0)], [2])
    hire = [e for e in result.logs[0][0].events if e["kind"] == "tool_call"][0]
    assert hire["error"] and "cannot grant 'ship'" in hire["result"]


def test_a_verifier_pays_and_a_silent_team_cannot_use_one(env):
    ids = env.task_ids(Split.HELDOUT)
    chat = word_chat(LOCAL)

    def play(cfg, b):
        policy = LOCAL.teacher(chat, cfg)
        r = run_teacher(policy, chat, [env.session(t, i) for i, t in enumerate(ids)],
                        [b] * len(ids), window=2048)
        assert policy.cut_turns == 0
        return r

    org = play(VerifyTeacherConfig(verifier_rate=1.0), 3)
    silent = play(VerifyTeacherConfig(silent=True), 3)
    single = play(VerifyTeacherConfig(), 0)
    for r in (org, silent, single):
        assert sum(g.rollouts[0].metrics["malformed_turns"] for g in r.groups) == 0
    assert all(g.rollouts[0].metrics["env/reviews"] >= 1 for g in org.groups)
    assert all(g.rollouts[0].metrics["env/shipped_defects"] == 0 for g in org.groups)
    for r in (silent, single):
        assert all(g.rollouts[0].metrics["env/reviews"] == 0 for g in r.groups)
        assert all(g.rollouts[0].metrics["messages"] == 0 for g in r.groups)
    assert totals(org).mean() > totals(single).mean() + 1.5
    assert totals(org).mean() > totals(silent).mean() + 1.5
    mixed = play(VerifyTeacherConfig(verifier_rate=0.5), 3)
    reviewed = [g.rollouts[0].metrics["env/reviews"] > 0 for g in mixed.groups]
    assert 0.2 < np.mean(reviewed) < 0.8  # room for RL to move the verifier share


def test_vocabulary_covers_prompts_results_and_teacher_words():
    import re

    from avalon.org.vocabulary import org_vocabulary
    words = set(LOCAL.vocabulary()) | set(org_vocabulary())
    texts = [LOCAL.task(t).prompt for t in LOCAL.task_ids(Split.TRAIN)[:10]]
    texts += ["p2 built 47", "p2 47 ok", "p2 47 defect", "p2 47 no defect found (own work)",
              "p2 shipped", "p2 has no result '11'", "p3 is closed after 2 wrong codes",
              "Build p1 p3. Send results to a1.", "Review what you get.", "Report results.",
              "Plan: 2 builders; verifier a1.", "p2 defect"]
    for text in texts:
        for w in re.findall(r"[A-Za-z0-9_]{2,}", text):
            assert w in words, w
