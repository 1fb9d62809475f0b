"""The console's ETA on fake clocks, with units (work, compile and backend-compile seconds)
shaped like the toy smoke run's (`configs/toy_org.py:smoke`, 4 SFT steps, evaluations at RLCR
steps 0, 2 and 3, 3 RLCR steps, on 2 shared cores): every progress line's ETA against the time
the invocation really had left (`experiments/bench/progress_eta.py`'s scoring), from the first
line on, for a fresh run and for one killed and resumed."""

from __future__ import annotations

import json
import os
import re

from avalon.train import eta
from experiments.bench.progress_eta import score
from tests.train.progress_sim import Timeline, play


def _cold(work: float, compiled: float) -> tuple[float, float, float]:
    return work, compiled, 0.9 * compiled  # XLA's backend: 90% of the smoke run's compiles


# A fresh run on a loaded machine (measured): every phase's first unit compiles for minutes,
# and RLCR steps 2 and 3 compile again (new batch shapes: 54 s and 13 s).
LOADED = Timeline(sft=[_cold(14.29, 249.06), _cold(25.16, 0), _cold(27.4, 0), _cold(11.28, 0)],
                  evals=[_cold(2.17, 274.95), _cold(1.56, 0), _cold(2.13, 0)],
                  rl=[_cold(6.96, 150.63), _cold(4.41, 53.61), _cold(3.65, 13.49)],
                  eval_every=2, rollouts=8, teacher_s=3.0, finish_s=1.8)
# The same config run earlier on the machine when it was less loaded (its work 1.4x, its
# compiles 1.7x as fast).
EARLIER = LOADED.scaled(work=0.7, compiled=0.6)
# What the resumed invocation of a run killed at RLCR step 3's rollouts costs, in the shares
# of the cold compiles a real resume measured (tracing and lowering, the cache's reads): the
# first RLCR step loads its programs and the evaluations' engine programs (16% of their cold
# compiles), the second 20% of its own; the third compiles afresh (killed as it began, it had
# put nothing in the cache); the evaluations compile next to nothing.
RESUMED = Timeline(sft=[], evals=[(1.6, 2.4, 0.7), (2.1, 0.0, 0.0)],
                   rl=[(6.5, 68.0, 15.0), (4.4, 11.0, 3.0), _cold(3.7, 13.5)],
                   eval_every=2, rollouts=8, finish_s=1.8)
SMOKE = dict(n_sft=4, n_rl=3)


def _machine(tmp_path) -> str:
    """The machine's record after one earlier run of the config."""
    timings = str(tmp_path / "timings" / "key.jsonl")
    play(str(tmp_path / "earlier"), EARLIER, **SMOKE, timings=timings)
    return timings


def _off(rows):
    """Lines whose ETA, as far as the display's rounding can tell, is outside 2x of the time
    left (`progress_eta.within_2x`), as (ETA, left)."""
    return [(r["eta"], r["left"]) for r in rows if not r["within_2x"]]


def test_a_fresh_run_is_forecast_from_its_first_line(tmp_path):
    """Every phase and every compile still to come is in the ETA from the first line: the
    machine's earlier run says what each unit costs (RLCR step 2's recompile included),
    and the units timed here scale it to the machine's speed now."""
    timings = _machine(tmp_path)
    lines, end = play(str(tmp_path / "run"), LOADED, **SMOKE, timings=timings)
    s = score(lines, end)
    assert s["untimed_lines"] == 0 and s["full_eta_lines"] == len(s["rows"]) >= 60
    assert _off(s["rows"]) == [] and s["within_2x"] == s["full_eta_lines"]
    assert not any("~" in text or "?" in text for _, text in lines)
    first = s["rows"][0]
    assert first["line"].startswith("[" + "." * 28 + "] 0/7 teacher traces ETA ")
    # each unit and where it came from: progress.jsonl holds every unit, the machine too
    units = [json.loads(line) for line in (tmp_path / "run" / "progress.jsonl").open()]
    assert [(u["phase"], u["ordinal"]) for u in units if "phase" in u] == [
        ("teacher", 0), ("sft", 0), ("sft", 1), ("sft", 2), ("sft", 3), ("eval", 0),
        ("rl", 0), ("rl", 1), ("eval", 2), ("rl", 2), ("eval", 3), ("finish", 0)]
    assert sum(1 for _ in open(timings)) == 2 * 12


def test_a_resumed_run_expects_its_programs_from_the_cache(tmp_path):
    """Killed at RLCR step 3's rollouts and resumed from step 4 (after SFT and the first
    evaluation): the resumed process loads what the killed one compiled (its tracing and
    lowering and a read), including the evaluations' engine programs, which its first RLCR
    step builds; every line within 2x."""
    timings = _machine(tmp_path)
    run = str(tmp_path / "run")
    play(run, LOADED, **SMOKE, timings=timings, kill_at_rl=3)
    lines, end = play(run, RESUMED, **SMOKE, sft_done=4, timings=timings)
    s = score(lines, end)
    assert lines[0][1].startswith("[" + "#" * 16 + "." * 12 + "] 4/7  RL 1/3: rollouts")
    assert s["untimed_lines"] == 0 and s["full_eta_lines"] == len(s["rows"]) >= 40
    assert _off(s["rows"]) == [], _off(s["rows"])
    # The old ETA expected the evaluation's 275 s compile again, or the first process's
    # times: minutes, with 60 s left.
    assert s["rows"][0]["eta"] < 2 * s["rows"][0]["left"]
    assert lines[-1][1].endswith("this run: steps 4 -> 7 (3 RLCR steps, 2 evaluations) in "
                                 "1m55s, 1m34s of it compiling")


def test_without_the_cache_a_resumed_process_compiles_again(tmp_path):
    timings = _machine(tmp_path)
    run = str(tmp_path / "run")
    play(run, LOADED, **SMOKE, timings=timings, kill_at_rl=3,
         compile_cache=False)
    lines, _ = play(run, RESUMED, **SMOKE, sft_done=4, timings=timings,
                    compile_cache=False)
    # the RL and evaluation programs' compiles (151 s and 275 s when killed) come again
    assert score(lines, 0.0)["rows"][0]["eta"] > 151 + 275


def test_a_config_this_machine_never_ran_is_a_guess_until_timed(tmp_path):
    """No record anywhere: every phase has a number from the first line (`eta.GUESS`), shown
    with `~`; the first compile timed here stands in for the phases not yet timed."""
    lines, _ = play(str(tmp_path / "run"), LOADED, **SMOKE)
    texts = [text for _, text in lines if "ETA" in text]
    assert texts[0].endswith("ETA ~4m57s") and not any("?" in t for t in texts)
    after_sft = next(t for t in texts if "4/7  SFT" in t)
    # evaluations and RLCR steps: not yet timed anywhere, each expects SFT's 249 s compile
    assert after_sft.split("ETA ~")[1].startswith("9m")
    assert all("ETA ~" in t for t in texts)  # the finish is timed only as the run ends


# The toy smoke run killed at RLCR step 2's rollouts and resumed from step 4, as measured
# (`experiments.bench.progress_eta --kill_at='RL 2/3: rollouts'`, empty machine record, the
# shipped reference): the killed process had compiled some of RLCR step 2's programs before the
# kill, so the resumed step 2, which no invocation finished, loaded most of its programs
# (11.0 s of compiling where the reference's cold step took 19.2 s). Units as measured; the
# cache's loads and compiles per unit as the process's counts showed them.
MEASURED_KILLED = Timeline(
    sft=[(0.58, 9.51, 8.12), (0.39, 0, 0), (0.61, 0, 0), (0.35, 0, 0)],
    evals=[(0.73, 33.48, 27.88)], rl=[(0.4, 6.82, 6.0)], eval_every=2, rollouts=8,
    teacher_s=0.57)
MEASURED_RESUMED = Timeline(
    sft=[], evals=[(0.62, 0.58, 0.21, (2, 0)), (0.59, 0.0, 0.0, (0, 0))],
    rl=[(0.91, 8.32, 2.05, (9, 1)), (0.83, 11.0, 7.0, (5, 3)), (1.25, 2.37, 2.08, (0, 2))],
    eval_every=2, rollouts=8, finish_s=0.92)


def test_a_unit_the_killed_process_began_goes_by_what_the_cache_serves(tmp_path):
    """The resumed RLCR step 2 was never finished, so its record says cold; as the cache
    serves its programs (5 of 8) it is forecast as that share loaded, and the 8 s of compiling
    the cold forecast still expected are not waited for (the ETA was 17 s with 6.4 s left).
    Every line is within 2x, the last RLCR step's and the finish's too."""
    run = str(tmp_path / "run")
    shipped = os.path.join(eta.SHIPPED_DIR, "34a2a0e4bc2782dc.jsonl")
    play(run, MEASURED_KILLED, **SMOKE, kill_at_rl=2, shipped=shipped)
    lines, end = play(run, MEASURED_RESUMED, **SMOKE, sft_done=4, shipped=shipped)
    s = score(lines, end)
    assert s["untimed_lines"] == 0 and s["full_eta_lines"] == len(s["rows"]) >= 40
    assert _off(s["rows"]) == [], _off(s["rows"])
    rl2 = [r for r in s["rows"] if re.search(r"RL 2/3: rollouts \d/8", r["line"])]
    assert len(rl2) == 8 and all(r["eta"] <= 1.6 * r["left"] for r in rl2)
