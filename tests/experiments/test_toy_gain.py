"""experiments/bench/toy_gain.py on hand-built evaluation logs (numbers worked out by hand)."""

from __future__ import annotations

import json
import os

import pytest

from avalon.analysis.logs import IndexEntry, rollout_file, step_dir, write_index
from experiments.bench.toy_gain import compare


def _log(task, seed, reward, *, review=False, sends=0, solve_result=None, send_text="hi"):
    ev = [{"kind": "start", "task_id": task, "seed": seed, "budget": 2, "agent": "ceo", "seq": 0},
          {"kind": "model_call", "agent": "ceo", "seq": 1},
          {"kind": "model_call", "agent": "a1", "seq": 2}]
    if solve_result is not None:
        ev.append({"kind": "tool_call", "agent": "a1", "tool": "solve", "error": False,
                   "result": f"s1 correct, result {solve_result}", "seq": 3})
    if review:
        ev.append({"kind": "tool_call", "agent": "a1", "tool": "review", "error": False,
                   "result": "p1 47 ok", "seq": 4})
    ev += [{"kind": "send", "agent": "a1", "text": send_text, "seq": 5 + i} for i in range(sends)]
    ev.append({"kind": "end", "agent": "ceo", "reason": "deadlock",
               "rewards": [{"agent": "ceo", "value": reward, "seq": 9}], "seq": 10})
    return ev


def _write(workdir, step, env, rollouts):
    d = step_dir(workdir, "eval", step)
    os.makedirs(d, exist_ok=True)
    entries = []
    for g, (arm, _task, seed_index, events) in enumerate(rollouts):
        name = rollout_file(g, 0)
        with open(os.path.join(d, name), "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))
        entries.append(IndexEntry(name, "eval", step, 0, env, arm, {"seed_index": seed_index}))
    write_index(d, entries)


def test_paired_rise_and_behaviours(tmp_path):
    w = str(tmp_path)
    # Three tasks, org arm: rewards 0,1,0 -> 1,1,2 (differences 1, 0, 2: mean 1, sd 1,
    # se 1/sqrt(3)); reviews 0/3 -> 2/3; one single-agent rollout per task.
    first = [("org", f"t{i}", 0, _log(f"t{i}", 1, r)) for i, r in enumerate((0, 1, 0))]
    first += [("single", f"t{i}", 0, _log(f"t{i}", 2, 0.5)) for i in range(3)]
    last = [("org", "t0", 0, _log("t0", 1, 1, review=True, sends=2)),
            ("org", "t1", 0, _log("t1", 1, 1, review=True)),
            ("org", "t2", 0, _log("t2", 1, 2))]
    last += [("single", f"t{i}", 0, _log(f"t{i}", 2, 0.5)) for i in range(3)]
    _write(w, 10, "verification", first)
    _write(w, 40, "verification", last)
    out = compare(w)
    assert (out["first_step"], out["last_step"]) == (10, 40)
    r = out["rise"]["org/all/reward"]
    assert r["n"] == 3 and r["first"] == pytest.approx(1 / 3) and r["last"] == pytest.approx(4 / 3)
    assert r["se"] == pytest.approx(1 / 3 ** 0.5) and r["z"] == pytest.approx(3 ** 0.5)
    rv = out["rise"]["org/verification/review_share"]
    assert rv["first"] == 0 and rv["last"] == pytest.approx(2 / 3)
    m = out["rise"]["org/all/messages_per_agent"]
    assert m["last"] == pytest.approx((2 / 2) / 3)  # 2 sends by 2 agents in one of 3 rollouts
    ovs = out["org_vs_single"]["last"]
    assert ovs["diff"] == pytest.approx(4 / 3 - 0.5)


def test_result_messages_count_only_the_senders_own_results(tmp_path):
    w = str(tmp_path)
    mine = _log("t0", 1, 0, solve_result=7, sends=1, send_text="s2 r1 7")
    other = _log("t1", 1, 0, solve_result=7, sends=1, send_text="s1 8")
    _write(w, 0, "parallel", [("org", "t0", 0, mine), ("org", "t1", 0, other)])
    _write(w, 5, "parallel", [("org", "t0", 0, mine), ("org", "t1", 0, other)])
    q = compare(w)["rise"]["org/parallel/result_messages"]
    assert q["first"] == pytest.approx(0.5)  # "7" was a1's result; "8" and the "1" of s1 not


def test_one_evaluation_is_an_error(tmp_path):
    _write(str(tmp_path), 0, "parallel", [("org", "t0", 0, _log("t0", 1, 0))])
    with pytest.raises(SystemExit, match="needs 2"):
        compare(str(tmp_path))
