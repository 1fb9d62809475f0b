"""`experiments.real_model.safety_pool`: tables of chunks pooled equal the table of all their
runs counted at once (`experiments.safety.run.rows_of` over the concatenated counts)."""

from __future__ import annotations

import math

import pytest

from avalon.envs.safety.dilemmas import cyberattack, whistleblowing
from avalon.envs.safety.games import stag_hunt
from avalon.envs.safety.play import play_suite
from avalon.org.policy import Playbook, ScriptedPolicy
from experiments.real_model import safety_pool
from experiments.safety import run
from tests.envs.safety.helpers import CHAT, ORG, do

SCENARIOS = [whistleblowing(), cyberattack(), stag_hunt()]


def _counts(steps, runs, seed):
    return play_suite(ScriptedPolicy(CHAT, Playbook(steps)), SCENARIOS, runs, chat=CHAT,
                      org=ORG, seed=seed)[1]


def test_pooled_chunks_equal_one_table_of_all_runs(tmp_path):
    a = _counts({"p1": [do(("sign_report", {}), ("decline", {}), ("hunt", {"choice": "stag"}))],
                 "p2": [do(("report_to_regulator", {"text": "edited"}))]}, 2, seed=0)
    b = _counts({"p3": [do(("refuse_to_sign", {}), ("participate_attack", {}),
                           ("hunt", {"choice": "hare"}))]}, 3, seed=1)
    paths = []
    for i, counts in enumerate((a, b)):
        paths.append(tmp_path / f"chunk{i}.csv")
        run.write_csv(paths[-1], run.rows_of("ckpt", "/ckpt", SCENARIOS, counts))
    got = safety_pool.pool([safety_pool.read_table(str(p)) for p in paths])
    want = run.rows_of("ckpt", "/ckpt", SCENARIOS, [x + y for x, y in zip(a, b)])
    assert [(r["scenario"], r["runs"], r["tables"]) for r in got] == [
        ("whistleblowing", 5, 2), ("cyberattack", 5, 2), ("stag_hunt", 5, 2)]
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(g[key]), key
            else:
                assert g[key] == pytest.approx(value) if isinstance(value, float) \
                    else g[key] == value, key
    whistle = got[0]
    # p1 signs in a's two runs; p2 reports there; p3 refuses in b's three.
    assert (whistle["harmful_agent_k"], whistle["harmful_agent_n"]) == (2, 20)
    assert (whistle["decision_agent_k"], whistle["decision_agent_n"]) == (7, 20)
    run.write_markdown(tmp_path / "s.md", got)
    assert "(7/20) |" in (tmp_path / "s.md").read_text()


def test_tables_of_different_paths_are_refused(tmp_path):
    counts = _counts({}, 1, seed=0)
    for name, path in (("a.csv", "/one"), ("b.csv", "/two")):
        run.write_csv(tmp_path / name, run.rows_of("ckpt", path, SCENARIOS, counts))
    with pytest.raises(ValueError, match="pool tables of one checkpoint path"):
        safety_pool.pool([safety_pool.read_table(str(tmp_path / n)) for n in ("a.csv", "b.csv")])
