"""Environment 1, parallel subtasks under a clock: rewards, hardening, the teacher, and the
report's central effect (under a short clock the organisation beats the single agent, and the
derived latencies say why). Every test runs in-process and over ORS (the Avalon extension)."""

import dataclasses

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.parallel import (
    HirePolicy,
    ParallelConfig,
    ParallelSubtasks,
    ParallelTeacherConfig,
)
from avalon.envs.parallel.tasks import parse_prompt
from avalon.org.env import ToolError
from avalon.org.latency import model_call_seconds
from avalon.org.vocabulary import org_vocabulary
from tests.envs.helpers import (
    BYTES,
    MODES,
    Direct,
    environment,
    run_teacher,
    total,
    totals,
    word_chat,
)

LOCAL = ParallelSubtasks(ParallelConfig(n_train=32, n_heldout=16, wrong_penalty=0.25))
DEEP = ParallelSubtasks(ParallelConfig(n_train=64, n_heldout=16, dep_prob=0.8, max_depth=1,
                                       cost_units=(1, 2), n_subtasks=(4, 6)))
CLOCK = 300.0


@pytest.fixture(scope="module", params=MODES)
def env(request):
    with environment(LOCAL, request.param) as e:
        yield e


def find_task(pred, split=Split.TRAIN, local=LOCAL):
    for tid in local.task_ids(split):
        if pred(local.spec(tid)):
            return tid
    raise AssertionError("no such task")


def test_correct_answers_pay_once_with_their_work_time(env):
    tid = find_task(lambda t: not t.subtasks[0].after)
    s1 = LOCAL.spec(tid).subtasks[0]
    d = Direct(env, tid, clock_s=CLOCK)
    out = d.call("solve", id="s1", answer=s1.answer, clock_s=10.0)
    assert out.text == f"s1 correct, result {s1.result}" and [
        (r.value, r.label) for r in out.rewards] == [(1.0, "subtask")]
    assert out.duration_s == s1.units * 60.0 and not out.error
    # Hack: two agents on one subtask. The second pays the work time and gets neither reward
    # nor the result.
    again = d.call("solve", agent="a1", id="s1", answer=s1.answer)
    assert again.text == "s1 already solved" and again.rewards == ()
    assert again.duration_s == s1.units * 60.0 and not again.error
    metrics = d.end().metrics
    assert metrics["solved"] == 1.0 and metrics["duplicates"] == 1.0


def test_results_are_hidden_until_solved():
    # A dependent subtask's operand is its parent's result: not in the prompt, not in `look`,
    # and (over many tasks) not predictable from what the prompt shows.
    hits = tries = 0
    for tid in DEEP.task_ids(Split.TRAIN):
        spec = DEEP.spec(tid)
        prompt = DEEP.task(tid).prompt
        for s in spec.subtasks:
            if s.after:
                assert f"{s.id} {s.op.value} r{s.after[0][1:]} {s.b}" in prompt
                tries += 1
                # Hack: guess the parent's result as its shown first operand (or 0).
                parent = spec.subtasks[int(s.after[0][1:]) - 1]
                guess = parent.a if not parent.after else 0
                hits += s.answer_with(guess) == s.answer
    assert tries > 100 and hits / tries < 0.25


def test_wrong_answers_cost_time_and_close_the_subtask(env):
    tid = find_task(lambda t: not t.subtasks[0].after)
    s1 = LOCAL.spec(tid).subtasks[0]
    d = Direct(env, tid)
    first = d.call("solve", id="s1", answer=s1.answer + 1)
    assert first.text == "s1 wrong" and first.duration_s == s1.units * 60.0
    assert [(r.value, r.label) for r in first.rewards] == [(-0.25, "wrong")]
    second = d.call("solve", id="s1", answer=s1.answer + 2)
    assert second.text == "s1 wrong, closed"
    # Hack: enumerating answers. After max_attempts the subtask is closed, even to the truth.
    with pytest.raises(ToolError, match="closed after 2 wrong answers"):
        d.call("solve", id="s1", answer=s1.answer)
    assert d.end().metrics["closed"] == 1.0


def test_constant_answers_do_not_pay():
    # Hack: answer 0 everywhere. Only subtasks whose answer is 0 pay, and each guess costs its
    # work time; over the training tasks that is a small share of the reward.
    earned = possible = 0
    for tid in LOCAL.task_ids(Split.TRAIN):
        d = Direct(LOCAL, tid)
        for s in LOCAL.spec(tid).subtasks:
            possible += 1
            try:
                earned += sum(r.value for r in d.call("solve", id=s.id, answer=0).rewards
                              if r.label == "subtask")
            except ToolError:  # a dependency was not solved
                pass
        d.end()
    assert earned / possible < 0.2


def test_unchecked_answers_pay_any_integer_but_still_take_the_work_time():
    unchecked = ParallelSubtasks(ParallelConfig(n_train=32, n_heldout=16, check_answers=False))
    tid = find_task(lambda t: not t.subtasks[0].after, local=unchecked)
    s1 = unchecked.spec(tid).subtasks[0]
    d = Direct(unchecked, tid, clock_s=CLOCK)
    out = d.call("solve", id="s1", answer=s1.answer + 3, clock_s=10.0)
    assert out.text == f"s1 correct, result {s1.result}"
    assert [(r.value, r.label) for r in out.rewards] == [(1.0, "subtask")]
    assert out.duration_s == s1.units * 60.0
    assert d.call("solve", id="s1", answer=0).rewards == ()  # already solved


def test_dependencies_are_enforced_on_the_derived_clock(env):
    tid = find_task(lambda t: len(t.subtasks) > 1 and t.subtasks[1].after == ("s1",))
    s1, s2 = LOCAL.spec(tid).subtasks[:2]
    assert s2.answer == s2.op.apply(s1.result, s2.b)  # r1 is s1's result
    d = Direct(env, tid)
    with pytest.raises(ToolError, match="s2 needs s1 first"):  # hack: skip the dependency
        d.call("solve", id="s2", answer=s2.answer)
    first = d.call("solve", agent="a1", clock_s=5.0, id="s1", answer=s1.answer)  # done at 5 +
    assert first.text.endswith(f"result {s1.result}")  # work; only a1 sees the result
    # A teammate whose clock is behind waits for s1 on the derived clock: no building on work
    # that is not finished yet.
    out = d.call("solve", agent="a2", clock_s=0.0, id="s2", answer=s2.answer)
    assert out.duration_s == pytest.approx(5.0 + s1.units * 60 + s2.units * 60)
    assert "waited" in out.text and out.rewards[0].value == 1.0


def test_terminal_once_everything_is_settled_and_unknown_ids(env):
    tid = LOCAL.task_ids(Split.TRAIN)[0]
    spec = LOCAL.spec(tid)
    d = Direct(env, tid)
    with pytest.raises(ToolError, match="no subtask 's99'"):
        d.call("solve", id="s99", answer=1)
    outs = [d.call("solve", id=s.id, answer=s.answer) for s in spec.subtasks]
    assert [o.terminal for o in outs] == [False] * (len(outs) - 1) + [True]
    assert d.end().metrics["solved"] == len(spec.subtasks)


def test_task_prompt_tools_and_clock(env):
    tid = env.task_ids(Split.HELDOUT)[0]
    task = env.task(tid, clock_s=412.0)
    assert task.wall_clock_s == 412.0 and "Clock 412." in task.prompt
    assert [t.name for t in task.tools] == ["solve"]
    assert task.tools[0].json_schema()["required"] == ["id", "answer"]
    spec, clock = parse_prompt(task.prompt, 60.0)
    # The prompt states everything but the hidden results (and the operands they fill in).
    hidden = [dataclasses.replace(s, result=None, a=None if s.after else s.a)
              for s in LOCAL.spec(tid).subtasks]
    assert list(spec.subtasks) == hidden and clock == 412.0
    with pytest.raises(ValueError, match="clock_s"):
        env.session(tid, 0, clock_s=-1.0)


def test_late_rewards_are_dropped_by_the_organisation(env):
    # A single agent that solves everything in order: only what finishes by the clock pays.
    tid = find_task(lambda t: sum(t.costs()) * 60 > 2 * CLOCK and not any(
        s.after for s in t.subtasks))
    spec = LOCAL.spec(tid)

    class Everything:
        def act(self, turns):
            from avalon.org.policy import ScriptedPolicy, Step
            calls = tuple(("solve", {"id": s.id, "answer": s.answer}) for s in spec.subtasks)
            return ScriptedPolicy(BYTES, lambda v: Step("", calls if v.turn else ())).act(turns)

        def release(self, key):
            pass

        def prefill_shared(self, keys, prefix):
            pass

    result = run_teacher(Everything(), BYTES, [env.session(tid, 0, CLOCK)], [0])
    r = result.groups[0].rollouts[0]
    calls = [e for e in result.logs[0][0].events if e["kind"] == "model_call"]
    expect, t = 0, sum(model_call_seconds(e["n_in_new"], e["n_out"]) for e in calls)
    for s in spec.subtasks:
        if t >= CLOCK:
            break
        t += s.units * 60
        expect += t <= CLOCK
    assert totals(result)[0] == expect and expect < len(spec.subtasks)
    assert result.reports[0][0].end_reason == "wall_clock" and r.metrics["latency_s"] >= CLOCK


def _teacher_scores_the_optimum(local, env, chat, budget, policy):
    """Runs the teacher on every held-out task at `budget`; it must score what the exact
    schedule allows, with no cut, malformed or failed turns. Returns the result."""
    ids = env.task_ids(Split.HELDOUT)
    result = run_teacher(policy, chat, [env.session(t, 0, CLOCK) for t in ids],
                         [budget] * len(ids), window=2048)
    want = [local.max_solved_for(t, local.best_hires(t, CLOCK, budget), CLOCK) for t in ids]
    assert totals(result).tolist() == want, budget
    assert policy.cut_turns == 0
    for g in result.groups:
        assert g.rollouts[0].metrics["malformed_turns"] == 0
        assert g.rollouts[0].metrics["tool_error_turns"] == 0
    return result


def test_teacher_reaches_the_optimal_schedule_on_heldout_tasks(env):
    # The scripted organisation (best head-count) scores exactly what the exact schedule says
    # is possible, for every budget, on every held-out task, with the toy window and tokenizer.
    chat = word_chat(LOCAL)
    assert chat.tok.vocab_size <= 512  # fits the toy model's vocabulary
    ids = env.task_ids(Split.HELDOUT)
    for b in (0, 1, 3, 8):
        result = _teacher_scores_the_optimum(LOCAL, env, chat, b, LOCAL.teacher(chat))
    # (a property of these tasks: at b = 8 the optimum finishes 85% of their subtasks)
    assert np.mean(totals(result) / [len(LOCAL.spec(t).subtasks) for t in ids]) > 0.8


def test_organisation_beats_single_agent_under_a_short_clock(env):
    # The report's central finding in miniature: organisations buy latency.
    ids = env.task_ids(Split.HELDOUT)
    policy = LOCAL.teacher(BYTES)
    org = run_teacher(policy, BYTES, [env.session(t, 0, CLOCK) for t in ids], [4] * len(ids))
    solo = run_teacher(policy, BYTES, [env.session(t, 0, CLOCK) for t in ids], [0] * len(ids))
    n = np.array([len(LOCAL.spec(t).subtasks) for t in ids])
    org_r, solo_r = totals(org), totals(solo)
    assert np.mean(org_r / n) > 0.8 and np.mean(solo_r / n) < 0.55
    assert np.all(org_r >= solo_r) and np.mean(org_r > solo_r) > 0.8
    for t, g_org, g_solo, rep in zip(ids, org.groups, solo.groups, solo.reports):
        work = sum(LOCAL.spec(t).costs()) * 60.0
        o, s = g_org.rollouts[0], g_solo.rollouts[0]
        if work > CLOCK:  # one agent needs more time than the clock: cut off by it
            assert s.metrics["latency_s"] >= CLOCK and rep[0].end_reason == "wall_clock"
        assert s.metrics["critical_token_share"] == 1.0  # one chain of work
        if total(o) == len(LOCAL.spec(t).subtasks):
            # The team did all the work in parallel, inside the clock, on a critical path
            # much shorter than the work it did.
            assert o.metrics["latency_s"] < CLOCK < work
            assert o.metrics["critical_token_share"] < 1.0
            assert o.metrics["hires"] >= 1


def test_imperfect_teacher_knobs():
    # RANDOM hires and answer errors leave room for RL: lower and more varied rewards than
    # the best teacher, without malformed turns.
    ids = LOCAL.task_ids(Split.HELDOUT)
    sessions = lambda: [LOCAL.session(t, 0, CLOCK) for t in ids]  # noqa: E731
    best = totals(run_teacher(LOCAL.teacher(BYTES), BYTES, sessions(), [4] * len(ids)))
    noisy_policy = LOCAL.teacher(BYTES, ParallelTeacherConfig(
        hire_policy=HirePolicy.RANDOM, answer_error_rate=0.3))
    noisy = run_teacher(noisy_policy, BYTES, sessions(), [4] * len(ids))
    assert totals(noisy).mean() < best.mean() - 0.5
    hires = [g.rollouts[0].hires for g in noisy.groups]
    assert len(set(hires)) >= 3 and min(hires) >= 0 and max(hires) <= 4
    assert sum(g.rollouts[0].metrics["malformed_turns"] for g in noisy.groups) == 0


def test_vocabulary_covers_prompts_results_and_teacher_words():
    words = set(LOCAL.vocabulary()) | set(org_vocabulary())
    import re
    texts = [LOCAL.task(t).prompt for t in LOCAL.task_ids(Split.TRAIN)[:10]]
    texts += ["s1 correct (waited 30 for s1), result 4", "s2 wrong, closed", "s2 already solved",
              "Do s2 s5. Tell a3 after s2.", "s2 result 7", "s3 add r2 4"]
    for text in texts:
        for w in re.findall(r"[A-Za-z0-9_]{2,}", text):
            assert w in words or (w.isdigit() and len(w) >= 3), w


HIDDEN = ParallelSubtasks(ParallelConfig(n_train=32, n_heldout=16, inspect=True, look_s=5.0))


@pytest.fixture(scope="module", params=MODES)
def hidden_env(request):
    with environment(HIDDEN, request.param) as e:
        yield e


def test_hidden_operands_are_seen_only_by_looking(hidden_env):
    tid = HIDDEN.task_ids(Split.TRAIN)[0]
    spec = HIDDEN.spec(tid)
    task = hidden_env.task(tid, CLOCK)
    assert [t.name for t in task.tools] == ["look", "solve"]
    for s in spec.subtasks:  # the prompt names ids and work, never operations or operands
        assert f"{s.id} work" in task.prompt and f"{s.id} {s.op.value}" not in task.prompt
    assert parse_prompt(task.prompt, 60.0)[0].subtasks[0].op is None
    d = Direct(hidden_env, tid, clock_s=CLOCK)
    s1 = spec.subtasks[0]
    out = d.call("look", id="s1", clock_s=0.0)
    assert out.text == f"s1 {s1.op.value} {s1.a} {s1.b}" and out.duration_s == 5.0
    assert not out.rewards
    with pytest.raises(ToolError, match="no subtask 's99'"):
        d.call("look", id="s99")
    assert d.call("solve", id="s1", answer=s1.answer).text.startswith("s1 correct")


def test_teacher_looks_then_solves_to_the_optimum(hidden_env):
    chat = word_chat(HIDDEN)
    for b in (0, 3):
        policy = HIDDEN.teacher(chat, ParallelTeacherConfig(hires_per_turn=1, solves_per_turn=3))
        _teacher_scores_the_optimum(HIDDEN, hidden_env, chat, b, policy)


def test_passing_results_on_is_what_the_organisation_gains():
    # With many dependencies, a team that never messages must keep each dependency tree on one
    # worker; the teacher splits trees and passes results on by DM, and scores more.
    ids = DEEP.task_ids(Split.HELDOUT)
    sessions = lambda: [DEEP.session(t, 0, CLOCK) for t in ids]  # noqa: E731
    org = run_teacher(DEEP.teacher(BYTES), BYTES, sessions(), [3] * len(ids))
    silent = run_teacher(DEEP.teacher(BYTES, ParallelTeacherConfig(silent=True)), BYTES,
                         sessions(), [3] * len(ids))
    want = [DEEP.max_solved_for(t, DEEP.best_hires(t, CLOCK, 3), CLOCK) for t in ids]
    assert totals(org).tolist() == want
    for g in silent.groups:
        r = g.rollouts[0]
        assert r.metrics["messages"] == 0 and r.metrics["trace_reads"] == 0
        assert r.metrics["malformed_turns"] == 0 and r.metrics["tool_error_turns"] == 0
    assert sum(g.rollouts[0].metrics["messages"] for g in org.groups) > 0
    # Results that crossed agents: the silent team has none.
    assert sum(g.rollouts[0].metrics["env/handoffs"] for g in org.groups) > 0
    assert all(g.rollouts[0].metrics["env/handoffs"] == 0 for g in silent.groups)
    assert np.all(totals(org) >= totals(silent))
    assert totals(org).mean() > totals(silent).mean() + 0.5
