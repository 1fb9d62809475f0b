"""The report names the code a run ran from the run's record of its starts
(`avalon/analysis/report_code.py`)."""

import json

from avalon.analysis.report_code import run_code

A, B = "9f91d94c1a2b" + "0" * 28, "86ef8af00000" + "1" * 28


def _history(run, *entries):
    (run / "config_history.jsonl").write_text(
        "".join(json.dumps({"step": s, "changed": {}, "code": c}) + "\n" for s, c in entries)
        + '{"step": 9, "cha')  # a line cut by a kill


def test_one_commit_resumed_at_the_same_code(tmp_path):
    _history(tmp_path, (0, {"commit": A, "dirty": False}), (600, {"commit": A, "dirty": False}))
    assert run_code(str(tmp_path), {}) == ("commit 9f91d94c1a2b", "9f91d94c1a2b")


def test_a_resume_at_other_code_names_both(tmp_path):
    _history(tmp_path, (0, {"commit": A, "dirty": False}), (600, {"commit": B, "dirty": True}))
    phrase, commit = run_code(str(tmp_path), {})
    assert phrase == ("commit 9f91d94c1a2b from step 0, then commit 86ef8af00000 with "
                      "uncommitted changes from step 600")
    assert commit == ""


def test_no_checkout_and_no_record(tmp_path):
    _history(tmp_path, (0, {"commit": None, "why": "avalon is not in a git checkout"}))
    assert run_code(str(tmp_path), {}) == (
        "an unrecorded commit (avalon is not in a git checkout)", "")
    empty = tmp_path / "old_run"
    empty.mkdir()
    assert run_code(str(empty), {}) == ("an unrecorded commit", "")
    assert run_code(str(empty), {"commit": "abc"}) == ("commit abc", "abc")
