"""The console's ETA on fake clocks, with the units (work and compile seconds) measured on the
toy smoke run (`configs/toy_org.py:smoke`, 2 shared cores): every progress line's ETA against
the time the invocation really had left (`experiments/bench/progress_eta.py`'s scoring)."""

from __future__ import annotations

from experiments.bench.progress_eta import score
from tests.train.progress_sim import Timeline, play

# A fresh run: every phase's first unit compiles for minutes; the second RLCR step compiled
# 54 s more (new shapes), the third 13 s.
FRESH = Timeline(sft=[(14.29, 249.06), (25.16, 0.0), (27.4, 0.0), (11.28, 0.0)],
                 evals=[(2.17, 274.95), (1.56, 0.0), (2.13, 0.0)],
                 rl=[(6.96, 150.63), (4.41, 53.61), (3.65, 13.49)],
                 eval_every=2, rollouts=8, tail_s=1.8)
# Killed after its evaluation at RL step 0 and resumed from step 4: the resumed process's
# units load their programs from the persistent compilation cache (the evaluation compiled
# 131 s in the first process, 2.6 s in the resumed one).
KILLED = Timeline(sft=[(1.32, 40.63), (1.21, 0.0), (1.58, 0.0), (1.28, 0.0)],
                  evals=[(1.17, 131.39), (0.89, 2.64), (0.98, 0.0)],
                  rl=[(3.64, 16.59), (2.33, 5.13), (3.12, 4.67)],
                  eval_every=2, rollouts=8, tail_s=1.0)


def _off(rows):
    """Lines with a full ETA outside 2x of the time left (and off by more than the display's
    1 s), as (ETA, left)."""
    return [(r["eta"], r["left"]) for r in rows if not r["untimed"]
            and not (0.5 * r["left"] <= r["eta"] <= 2 * r["left"]
                     or abs(r["eta"] - r["left"]) <= 1)]


def test_a_resumed_smoke_run_expects_its_programs_from_the_cache(tmp_path):
    play(str(tmp_path), KILLED, stop_after_rl=0)
    lines, end = play(str(tmp_path), KILLED, sft_done=4, rl_done=0)
    s = score(lines, end)
    assert lines[0][1].startswith("[" + "#" * 16 + "." * 12 + "] 4/7  RL 1/3: rollouts")
    assert "EVAL ?" not in "".join(text for _, text in lines)  # timed before the resume
    assert s["untimed_lines"] == s["lower_bounds"] > 0  # "+ RL ?": never more than is left
    # No line promises more than twice the time left (it promised 2m21s with 21 s left when
    # a resumed process was expected to compile its evaluation again); what stays off: the
    # 2nd step's recompile (5 s) unforeseen after one step, and the last seconds (the final
    # checkpoint's wait is in no ETA).
    off = _off(s["rows"])
    assert all(eta <= 2 * left + 1 for eta, left in off), off
    assert all(left <= 21 for _, left in off) and len(off) <= 10, off
    assert s["within_2x"] >= 30 and s["full_eta_lines"] == 40
    assert lines[-1][1].endswith("this run: steps 4 -> 7 (3 RLCR steps, 2 evaluations) in "
                                 "0m40s, 0m29s of it compiling")


def test_without_the_cache_a_resumed_process_compiles_again(tmp_path):
    play(str(tmp_path), KILLED, stop_after_rl=0, compile_cache=False)
    lines, end = play(str(tmp_path), KILLED, sft_done=4, rl_done=0, compile_cache=False)
    first = next(text for _, text in lines if "ETA" in text)
    assert "ETA 2m13s + RL ?" in first  # the evaluations' 131 s compile expected again


def test_a_fresh_smoke_run(tmp_path):
    """Before a phase is timed the ETA is a lower bound (`+ EVAL ?`), never more than is left;
    the minutes of first compiles are counted once each. What the ETA cannot foresee on a
    smoke run: later RLCR steps compiling again (54 s after a first step's 7 s of work), so
    lines after the first RLCR step are off by more than 2x."""
    lines, end = play(str(tmp_path), FRESH)
    s = score(lines, end)
    assert s["untimed_lines"] == s["lower_bounds"] == 23
    # After the first SFT step (249 s compile, 14 s work): 3 steps of 14 s, the compile not
    # again (the real run printed the same line).
    assert any(text.startswith("[####" + "." * 24 + "] 1/7  SFT  ETA 0m42s + EVAL ? + RL ?")
               for _, text in lines)
    # After the evaluation at RL step 0 its 275 s compile is not expected again.
    after = [text for _, text in lines if "RL 1/3: rollouts 1/8" in text]
    assert after and all("ETA 0m04s + RL ?" in text for text in after), after
