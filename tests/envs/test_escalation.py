"""The escalation-reward variant: which tasks carry a red flag, what a report earns or costs,
and the teacher that reports (against the inner environment's own teacher, same seeds)."""

import importlib

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.escalation import (
    ALREADY,
    FLAG_PREFIX,
    REPORT,
    REPORTED,
    Escalation,
    EscalationConfig,
)
from avalon.envs.verification import Verification, VerificationConfig, VerifyTeacherConfig
from avalon.envs.wealth import Wealth
from tests.envs.helpers import Direct, run_teacher, totals, word_chat

INNER = Verification(VerificationConfig(n_train=512, n_heldout=24))
ENV = Escalation(INNER, EscalationConfig(flag_rate=0.3))


def _flagged(env, split=Split.TRAIN):
    return [t for t in env.task_ids(split) if env.flag(t) is not None]


def test_a_share_of_tasks_carries_a_fixed_flag_in_its_prompt():
    ids = ENV.task_ids(Split.TRAIN)
    flagged = _flagged(ENV)
    assert 0.25 < len(flagged) / len(ids) < 0.35
    assert _flagged(ENV) == flagged  # a function of the task id
    assert _flagged(Escalation(INNER, EscalationConfig(flag_rate=0.3, salt=1))) != flagged
    assert _flagged(Escalation(INNER, EscalationConfig(flag_rate=0.0))) == []
    assert len(_flagged(Escalation(INNER, EscalationConfig(flag_rate=1.0)))) == len(ids)
    clean = next(t for t in ids if t not in flagged)
    assert ENV.task(clean).prompt == INNER.task(clean).prompt
    task = ENV.task(flagged[0])
    assert task.prompt.startswith(INNER.task(flagged[0]).prompt + "\n" + FLAG_PREFIX)
    assert task.tools == INNER.task(flagged[0]).tools + (REPORT,)
    assert ENV.name == "verification_escalation"


def test_a_report_earns_on_a_flagged_task_and_costs_on_a_clean_one():
    flagged = _flagged(ENV)[0]
    clean = next(t for t in ENV.task_ids(Split.TRAIN) if ENV.flag(t) is None)
    d = Direct(ENV, flagged)
    assert d.call("report_to_overseer", agent="a2", text="the log is hidden").text == REPORTED
    assert d.call("report_to_overseer", text="again").text == ALREADY  # counted once
    out = d.end()
    assert [(r.value, r.label) for r in out.rewards] == [(1.0, "escalation")]
    assert (out.metrics["escalation_flagged"], out.metrics["escalation_reported"]) == (1.0, 1.0)
    d = Direct(ENV, clean)
    d.call("report_to_overseer", text="looks wrong")
    out = d.end()
    assert [(r.value, r.label) for r in out.rewards] == [(-0.5, "false_alarm")]
    assert (out.metrics["escalation_flagged"], out.metrics["escalation_reported"]) == (0.0, 1.0)
    out = Direct(ENV, flagged).end()  # a flag nobody reports: nothing either way
    assert out.rewards == () and out.metrics["escalation_reported"] == 0.0
    assert Direct(ENV, flagged).call("report_to_overseer", text="x").duration_s == 5.0


def test_inner_calls_and_outcomes_pass_through_unchanged():
    tid = ENV.task_ids(Split.TRAIN)[3]
    a, b = Direct(ENV, tid, seed=7), Direct(INNER, tid, seed=7)
    for _ in range(3):
        assert a.call("build", agent="a1", id="p1").text == b.call("build", agent="a1",
                                                                  id="p1").text
    ra, rb = a.end(), b.end()
    assert ra.rewards == rb.rewards
    assert {k: v for k, v in ra.metrics.items() if not k.startswith("escalation")} == rb.metrics


def test_the_teacher_reports_every_red_flag_and_changes_nothing_else():
    """Played through the org driver on held-out tasks: the teacher's CEO reports flagged tasks
    only, and each rollout's return is the inner teacher's (same seeds) plus the report reward."""
    ids = ENV.task_ids(Split.HELDOUT)
    assert 0 < len(_flagged(ENV, Split.HELDOUT)) < len(ids)
    chat = word_chat(ENV)
    cfg = VerifyTeacherConfig(verifier_rate=1.0)
    wrapped = ENV.teacher(INNER.teacher(chat, cfg))
    r = run_teacher(wrapped, chat, [ENV.session(t, i) for i, t in enumerate(ids)],
                    [3] * len(ids), window=1536)
    inner = run_teacher(INNER.teacher(chat, cfg), chat,
                        [INNER.session(t, i) for i, t in enumerate(ids)], [3] * len(ids),
                        window=1536)
    assert wrapped.cut_turns == 0
    reported = [g.rollouts[0].metrics["env/escalation_reported"] for g in r.groups]
    assert reported == [float(ENV.flag(t) is not None) for t in ids]
    assert sum(g.rollouts[0].metrics["malformed_turns"] for g in r.groups) == 0
    np.testing.assert_allclose(totals(r), totals(inner) + np.array(reported))


def test_bad_configs_and_unwrappable_environments_say_so():
    with pytest.raises(ValueError, match=r"EscalationConfig.flag_rate=1.5: must be in \[0, 1\]"):
        EscalationConfig(flag_rate=1.5)
    with pytest.raises(ValueError, match=r"EscalationConfig.false_alarm_cost=-1: must be"):
        EscalationConfig(false_alarm_cost=-1)
    with pytest.raises(ValueError, match="scored by gkpo; only summed rewards can be wrapped"):
        Escalation(Wealth())


def test_the_toy_escalation_config_fits_the_toy_vocabulary():
    from avalon.train.config import from_config_dict
    from avalon.train.setup import build_tokenizer
    toy = importlib.import_module("configs.toy_escalation")
    c = toy.get_config("smoke")
    cfg = from_config_dict(c, num_devices=1)
    envs = cfg.make_environments(c.env)
    assert [e.name for e in envs] == ["verification_escalation"]
    assert build_tokenizer(cfg, envs).vocab_size <= cfg.model.vocab_size
    teacher = cfg.make_teacher(envs[0], word_chat(envs[0]))
    assert teacher.cast is not None
