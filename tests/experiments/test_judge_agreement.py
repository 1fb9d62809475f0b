"""`experiments.real_model.judge_agreement` without a model: hand-built logs, a fake model judge
and a fake reference judge whose labels are written out, kappa and confusion worked by hand."""

from __future__ import annotations

import json
import os

import pytest

from avalon import command
from avalon.analysis.judges import RuleJudge
from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
from experiments.real_model import judge_agreement as ja
from tests.analysis.builders import single_agent, team_with_lead

MSGS = ["please review my part a", "happy to help with part b", "review of @a1 part a: LGTM",
        "status: reviewed a"]
THOUGHTS = ["I will build part a", "waiting", "I can help a1 with part b", "Reviewed part a"]
PLAN = ("Plan: split by component\nhire Lead Engineer: build part a\nhire QA Reviewer: review\n"
        "hire Data Analyst: part b")


class TableJudge:
    """Labels from a table {rubric: {text: label}}; a label of None is an answer that named no
    allowed label: the rubric's fallback, counted in `invalid` (as `ModelJudge` does)."""

    def __init__(self, table):
        self.table, self.invalid, self.calls = table, 0, []

    def label(self, rubric, texts):
        self.calls.append((rubric.name, list(texts)))
        out = []
        for t in texts:
            lab = self.table[rubric.name][t]
            if lab is None:
                self.invalid += 1
                lab = rubric.labels[0]
            out.append(lab)
        return out


RULE = TableJudge({
    "review": dict(zip(MSGS, ["none", "none", "approve", "approve"])),
    "help_offer": dict(zip(MSGS, ["no", "yes", "no", "no"])),
    "help_plan": dict(zip(THOUGHTS, ["no", "no", "yes", "no"])),
    "opening_plan": {PLAN: "component"}})
MODEL = {
    # "status: reviewed a" answered with no label: the fallback "none".
    "review": dict(zip(MSGS, ["none", "none", "approve", None])),
    "help_offer": dict(zip(MSGS, ["no", "yes", "no", "no"])),
    "help_plan": dict.fromkeys(THOUGHTS, "yes"),
    "opening_plan": {PLAN: "component"}}


def _logs():
    return [team_with_lead().events, single_agent().events]


def test_texts_by_rubric_are_messages_reasoning_and_the_opening_plan():
    texts = ja.texts_by_rubric(_logs())
    assert texts == {"review": MSGS, "help_offer": MSGS, "help_plan": THOUGHTS,
                     "opening_plan": [PLAN]}


def test_kappa_confusion_examples_and_answers_without_a_label():
    res = ja.agreement(_logs(), TableJudge(MODEL), rule=RULE)
    review = res["review"]
    # Rule none/none/approve/approve, model none/none/approve/none: p_o 3/4; marginals rule
    # (none 1/2, approve 1/2), model (none 3/4, approve 1/4): p_e 1/2; kappa (3/4-1/2)/(1/2).
    assert review["kappa"] == pytest.approx(0.5)
    assert (review["items"], review["agree"], review["model_no_label"]) == (4, 3, 1)
    assert review["confusion"] == {"approve->approve": 1, "approve->none": 1, "none->none": 2}
    assert review["disagreements"] == {"approve->none": ["status: reviewed a"]}
    assert review["rule_labels"] == {"none": 2, "approve": 2}
    assert review["model_labels"] == {"none": 3, "approve": 1}
    assert res["help_offer"]["kappa"] == pytest.approx(1.0)
    assert res["help_offer"]["model_no_label"] == 0
    # The model says yes to all four: p_o 1/4 = p_e (rule yes 1/4 x model yes 1): kappa 0.
    plan = res["help_plan"]
    assert plan["kappa"] == pytest.approx(0.0) and plan["agree"] == 1
    assert plan["disagreements"] == {"no->yes": THOUGHTS[:2]}  # at most EXAMPLES a kind
    # One plan, both "component": one label throughout, kappa 1 by convention.
    assert res["opening_plan"]["kappa"] == 1.0 and res["opening_plan"]["items"] == 1
    table = ja.markdown(res, "title")
    assert "| review | 4 | 3 | 0.50 | approve 2, none 2 | approve 1, none 3 | 1 | " \
           "approve->approve: 1, approve->none: 1, none->none: 2 |" in table
    assert '- help_plan no->yes: "waiting"' in table


def test_max_items_takes_the_first_texts_and_no_texts_have_no_kappa():
    model = TableJudge(MODEL)
    res = ja.agreement(_logs(), model, rule=RULE, max_items=2)
    assert [c for c in model.calls if c[0] == "review"] == [("review", MSGS[:2])]
    assert res["review"]["items"] == 2 and res["review"]["model_no_label"] == 0
    empty = ja.agreement([single_agent().events], model, rule=RULE)
    assert all(r["items"] == 0 and r["kappa"] is None for r in empty.values())
    assert "| review | 0 | 0 | n/a | - | - | 0 | - |" in ja.markdown(empty, "t")
    with pytest.raises(ValueError, match="--max_items must be >= 1, got 0"):
        ja.agreement(_logs(), model, max_items=0)


def test_the_rule_judge_is_the_default_reference():
    # Against itself the rule judge agrees everywhere (kappa 1 on every rubric with items).
    res = ja.agreement(_logs(), RuleJudge())
    assert all(r["kappa"] == pytest.approx(1.0) and r["agree"] == r["items"]
               for r in res.values())


def _write_eval(workdir, step, rollouts):
    log_dir = step_dir(workdir, "eval", step)
    os.makedirs(log_dir)
    for i, r in enumerate(rollouts):
        with open(os.path.join(log_dir, rollout_file(0, i)), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in r.events)
    write_index(log_dir, [IndexEntry(rollout_file(0, i), "eval", step, 0, "toy", r.arm)
                          for i, r in enumerate(rollouts)])


def test_evaluation_logs_picks_the_newest_or_a_named_step(tmp_path):
    _write_eval(tmp_path, 10, [team_with_lead()])
    _write_eval(tmp_path, 30, [team_with_lead(), single_agent()])
    step, logs = ja.evaluation_logs(str(tmp_path))
    assert step == 30 and len(logs) == 2
    step, logs = ja.evaluation_logs(str(tmp_path), step=10)
    assert step == 10 and len(logs) == 1
    with pytest.raises(command.Stop, match=r"--step=20: the run's eval steps are \[10, 30\]"):
        ja.evaluation_logs(str(tmp_path), step=20)
    with pytest.raises(command.Stop, match="no eval event logs"):
        ja.evaluation_logs(str(tmp_path / "nothing"))
