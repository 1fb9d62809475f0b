"""`python -m avalon.analyze` on a hand-built run directory (fast; numbers by hand), and on the
toy smoke run (`configs/toy_org.py:smoke`, slow: one real run per session)."""

import copy
import json
import os
import re

import pytest

from avalon import analyze, command
from avalon.analysis.logs import IndexEntry, step_dir, write_index
from avalon.analysis.stats import wilson
from avalon.org.events import dumps
from tests.analysis.builders import single_agent, team_with_lead, team_without_lead


def _variant(rollout, task_id=None, answer=None, final_reward=None):
    events = copy.deepcopy(rollout.events)
    if task_id is not None:
        events[0]["task_id"] = task_id
    for e in events:
        if answer is not None and e["kind"] == "tool_call" and e["tool"] == "final_message":
            e["args"] = {"text": answer}
        if final_reward is not None and e["kind"] == "end":
            e["rewards"] = [{"value": final_reward, "label": "final"}]
    return events


def _write(run, step, logs):
    """logs: [(arm, events, extra)]"""
    d = step_dir(run, "eval", step)
    os.makedirs(d, exist_ok=True)
    entries = []
    for i, (arm, events, extra) in enumerate(logs):
        name = f"group{i}_rollout0.jsonl"
        with open(os.path.join(d, name), "w") as f:
            f.write("".join(dumps(e) + "\n" for e in events))
        entries.append(IndexEntry(name, "eval", step, step // 5, "toy", arm, extra))
    write_index(d, entries)


def _hand_run(run):
    single = single_agent()
    for step in (0, 5):
        _write(run, step, [
            ("org", team_with_lead().events, {}),  # t1: 2.0
            ("org", team_without_lead().events, {}),  # t2: 1.0
            ("single", single.events, {}),  # t1: 1.5
            ("single", _variant(single, task_id="t2"), {}),  # t2: 1.5
            ("s8", single.events, {}),  # latency 32.1
            ("best_of_k", _variant(single, answer="x"), {"k": 3}),  # 1.5
            ("best_of_k", _variant(single, answer="y", final_reward=0.0), {"k": 3}),  # 1.0
            ("best_of_k", _variant(single, answer="y", final_reward=0.0), {"k": 3}),  # 1.0
        ])


def _analyze(*runs):
    analyze.main([str(r) for r in runs])  # in-process: a subprocess start costs seconds


def _check_outputs(run):
    out = run / "report"
    with open(out / "report.json") as f:
        report = json.load(f)
    for name in ("rewards", "org_metrics", "review_quality", "latency"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    # Self-contained: no external scripts, styles or images; only links to episode pages.
    assert not re.search(r'<(script|link)[^>]*(src|href)=', page)
    assert all(src.startswith("data:image/png;base64,")
               for src in re.findall(r'<img[^>]*src="([^"]+)"', page))
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert hrefs and all(h.startswith("episodes/") and (out / h).exists() for h in hrefs)
    return report, page


def test_analyze_a_hand_built_run(tmp_path):
    run = tmp_path / "run"
    _hand_run(run)
    # The code the run recorded at its start (avalon/train/config_history.py) is named.
    (run / "config_history.jsonl").write_text(json.dumps(
        {"step": 0, "changed": {}, "code": {"commit": "ab12" * 10, "dirty": True}}) + "\n")
    other = tmp_path / "single_rl"
    _write(other, 5, [("org", single_agent().events, {}), ("single", single_agent().events, {})])
    _analyze(run, other)
    report, page = _check_outputs(run)
    assert report["rollouts"] == 16 and report["last_eval_step"] == 5
    comp = report["comparisons"][1]
    assert comp["step"] == 5 and comp["over_environments"] is None  # one environment
    toy = comp["environments"]["toy"]
    assert toy["org_reward"]["estimate"] == 1.5 and toy["single_reward"]["estimate"] == 1.5
    # Per task: t1 2.0 vs 1.5, t2 1.0 vs 1.5: ranks 1.5 and 1.5, W+ = 1.5, p = 1.
    w = toy["over_tasks"]["wilcoxon"]
    assert (w["n_up"], w["n_down"], w["n_ties"], w["w_plus"], w["p_value"]) == (1, 1, 0, 1.5,
                                                                                1.0)
    rows = {b["arm"]: b for b in report["baselines"] if b["step"] == 5}
    assert set(rows) == {"org", "single", "s8", "best_of_k"}
    assert rows["s8"]["latency_vs_org"] == pytest.approx(32.1 / ((16.3 + 7.0) / 2))
    assert rows["s8"]["tokens_out"]["estimate"] == 100.0 and rows["s8"]["rl_step"] == 1
    bok = [b for b in report["best_of_k"] if b["step"] == 5]
    assert len(bok) == 1 and (bok[0]["k"], bok[0]["tasks"]) == (3, 1)
    assert bok[0]["best"]["estimate"] == 1.5 and bok[0]["vote"]["estimate"] == 1.0  # "y" wins
    org5 = next(c for c in report["checkpoints"] if c["step"] == 5 and c["arm"] == "org")
    assert org5["lead_title_share"]["estimate"] == 0.2  # 1 lead of 5 hires
    # Against the RL step (steps 0 and 5 were RL steps 0 and 1), with the Wilson interval.
    lo, hi = wilson(1, 5).low, wilson(1, 5).high
    assert report["curves"]["lead_title_share"] == {"org": [[0, 0.2, lo, hi], [1, 0.2, lo, hi]]}
    assert [r["run"] for r in report["runs"]].count("single_rl") == 2
    assert len(report["episodes"]) == 8
    linked = [r for r in report["per_rollout"] if r["episode"]]
    assert [r["episode"] for r in linked] == report["episodes"]
    assert all(r["step"] == 5 for r in linked)
    assert "Organisation vs single agent" in page
    code = "commit ab12ab12ab12 with uncommitted changes"
    assert report["code"] == code and report["learning"].startswith(f"Run `run` at {code} (")
    assert f"at {code}</p>" in page


def test_analyze_rejects_a_directory_without_logs(tmp_path):
    with pytest.raises(command.Stop, match="no events/ directory"):
        analyze.main([str(tmp_path)])


@pytest.mark.slow
@pytest.mark.ci
def test_analyze_the_toy_smoke_run(toy_smoke_run):
    _analyze(toy_smoke_run)
    report, _ = _check_outputs(toy_smoke_run)
    steps = sorted({c["step"] for c in report["checkpoints"] if c["phase"] == "eval"})
    assert len(steps) >= 2  # after SFT and later
    for c in report["comparisons"]:
        assert c["environments"], c
    arms = {b["arm"] for b in report["baselines"]}
    assert {"org", "single"} <= arms
