"""The console: an ETA per phase from measured unit times and compiles (including those timed
before a resume), status notes, the end line of an invocation, MFU only on known devices; a
fresh program's first run counts as compile time (`inference/first_run.py`)."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.inference.engine import Engine
from avalon.inference.first_run import FirstRuns
from avalon.train import eta
from avalon.train.telemetry import (
    CompileClock,
    ProgressBar,
    Telemetry,
    Unit,
    fmt_seconds,
    history,
    peak_flops,
)


class FakeClocks:
    """A wall clock and a compile clock the test advances by hand."""

    def __init__(self):
        self.now, self.compiled = 1000.0, 0.0

    def wall(self):
        return self.now

    def compile(self):
        return self.compiled

    def work(self, seconds: float, compiling: float = 0.0):
        self.now += seconds + compiling
        self.compiled += compiling


def _unit(bar, clocks, phase, seconds, compiling=0.0):
    bar.begin(phase)
    clocks.work(seconds, compiling)
    bar.record(phase)


def _reference(*units):
    """A reference of one earlier invocation: (phase, ordinal, work, compile[, backend])."""
    return eta.Reference(machine=[eta.Timed(p, o, w, c, *rest, invocation="earlier")
                                  for p, o, w, c, *rest in units])


# An earlier run of 5 SFT steps (2 s each; the first compiles 100 s), evaluations at RLCR
# steps 0 and 6 (20 s; the first compiles 60 s) and 6 RLCR steps (10 s, the first compiling
# 300 s and the second 30 s more for a new batch shape; then 15 s).
EARLIER = [("sft", 0, 2.0, 100.0, 90.0), *[("sft", k, 2.0, 0.0) for k in range(1, 5)],
           ("eval", 0, 20.0, 60.0, 50.0), ("rl", 0, 10.0, 300.0, 280.0), ("rl", 1, 10.0, 30.0),
           *[("rl", k, 15.0, 0.0) for k in range(2, 6)], ("eval", 6, 20.0, 0.0)]
SCHEDULE = [*[("sft", k) for k in range(5)], ("eval", 0), *[("rl", k) for k in range(6)],
            ("eval", 6)]


def test_every_unit_is_forecast_from_the_reference_and_scaled_to_this_run():
    """From the first line every unit left is counted, compiles to come included (RLCR step
    2's as well); what this invocation's units take against the reference scales the rest:
    work per phase (else over all), compiles over all phases, a compile running long at once;
    the unit in progress counts what is left of it."""
    clocks, out = FakeClocks(), io.StringIO()
    bar = ProgressBar(11, stream=out, clock=clocks.wall, compile_clock=clocks.compile,
                      reference=_reference(*EARLIER))
    bar.plan(SCHEDULE)
    assert bar.eta_seconds() == (5 * 2 + 100 + 20 + 60 + (2 * 10 + 4 * 15) + 300 + 30 + 20, [])
    # 1.5x the compile: one unit moves the compile factor halfway there (in log terms); a
    # phase's first unit here carries one-off setup: no work factor yet
    _unit(bar, clocks, "sft", 4.0, compiling=150.0)
    c = 1.5 ** 0.5
    assert bar.eta_seconds()[0] == pytest.approx(
        4 * 2 + (20 + 60 * c) + (10 + 300 * c) + (10 + 30 * c) + 4 * 15 + 20)
    bar.update(1, "SFT")
    assert "ETA 10m06s  compiled 2m30s" in out.getvalue().split("\r")[-1]
    _unit(bar, clocks, "sft", 4.0)
    work = 2.0  # this machine works twice as slowly: every phase's work doubles
    assert bar.eta_seconds()[0] == pytest.approx(
        3 * 2 * work + (20 * work + 60 * c) + (10 * work + 300 * c) + (10 * work + 30 * c)
        + 4 * 15 * work + 20 * work)
    bar.begin("sft")  # 3 s into a step of 4: 1 s of it left
    clocks.work(3.0)
    assert bar.phase_estimate("sft") == pytest.approx(1.0 + 2 * 4.0)
    clocks.work(1.0)
    bar.record("sft")
    for _ in range(2):
        _unit(bar, clocks, "sft", 4.0)
    bar.begin("eval")
    clocks.work(0.0, compiling=120.0)  # 2x the reference's 60 s, and still compiling
    assert bar.phase_estimate("rl") == pytest.approx((2 * 10 + 4 * 15) * work + 300 * 2
                                                     + 30 * 2)
    assert bar.phase_estimate("eval") == pytest.approx(20 * work + 20 * work)  # compiled all


def test_without_a_reference_this_run_and_guesses_make_the_forecast():
    """A config never timed: each phase a guess (`eta.GUESS`, shown with `~`) until it is
    timed here; a phase not yet timed expects the first compiles seen here; a phase timed
    here its mean work, and later units the mean of what its later units compiled."""
    clocks = FakeClocks()
    bar = ProgressBar(11, stream=io.StringIO(), clock=clocks.wall,
                      compile_clock=clocks.compile)
    bar.plan({"sft": 5, "eval": 2, "rl": 6})
    g = eta.GUESS
    assert bar.eta_seconds() == (5 * g["sft"][0] + g["sft"][1] + 2 * g["eval"][0]
                                 + g["eval"][1] + 6 * g["rl"][0] + g["rl"][1],
                                 ["sft", "eval", "rl"])
    assert bar.eta().startswith("~")
    _unit(bar, clocks, "sft", 2.0, compiling=104.0)
    assert bar.eta_seconds() == (4 * 2.0 + 2 * g["eval"][0] + 104 + 6 * g["rl"][0] + 104,
                                 ["eval", "rl"])
    for _ in range(4):
        _unit(bar, clocks, "sft", 2.0)
    _unit(bar, clocks, "eval", 20.0, compiling=60.0)
    _unit(bar, clocks, "rl", 10.0, compiling=356.0)
    _unit(bar, clocks, "rl", 10.0, compiling=3.0)  # a new batch shape compiles mid-run
    assert bar.eta_seconds() == (4 * (10.0 + 3.0) + 20.0, [])
    assert bar.eta() == fmt_seconds(72)
    assert bar.compile_s == 104.0 + 60.0 + 356.0 + 3.0


def test_a_resumed_run_knows_what_was_timed_before(tmp_path):
    """Telemetry appends every unit to WORKDIR/progress.jsonl (and the unit's split to its
    metrics line); a resumed invocation reads them back: its first line counts the units it
    repeats at what they took, and with the persistent compilation cache the programs an
    earlier invocation began load (their compile less 95% of its backend part); without the
    cache they compile again, a phase's first programs included. The bar starts at the
    resumed step, and the end line says what this invocation did."""
    clocks = FakeClocks()
    first = Telemetry(str(tmp_path), total_steps=4, stream=io.StringIO(), clock=clocks.wall,
                      compile_clock=clocks.compile, backend_clock=lambda: clocks.compiled)
    bar = first.progress
    bar.plan([("sft", 0), ("sft", 1), ("eval", 0), ("rl", 0), ("rl", 1), ("eval", 2)])
    for step, phase, work, compiling in [(1, "sft", 2.0, 50.0), (2, "sft", 2.0, 0.0),
                                         (2, "eval", 8.0, 40.0), (3, "rl", 10.0, 30.0)]:
        _unit(bar, clocks, phase, work, compiling)
        first.log(step, {"phase": phase})
    bar.begin("rl")  # killed in RLCR step 2
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["progress/work_s"], r["progress/compile_s"], r["progress/first"])
            for r in kept] == [(2.0, 50.0, True), (2.0, 0.0, False), (8.0, 40.0, True),
                               (10.0, 30.0, True)]
    units = eta.read_record(tmp_path / "progress.jsonl")
    assert [(u.phase, u.ordinal, u.compile_s, u.backend_s) for u in units] == [
        ("sft", 0, 50.0, 50.0), ("sft", 1, 0.0, 0.0), ("eval", 0, 40.0, 40.0),
        ("rl", 0, 30.0, 30.0)]

    def resumed(cache: bool, out=None):
        t = Telemetry(str(tmp_path), resume_step=2, total_steps=4, stream=out or io.StringIO(),
                      clock=clocks.wall, compile_clock=clocks.compile, compile_cache=cache)
        t.progress.plan([("rl", 0), ("rl", 1), ("eval", 2)])
        return t

    # RLCR step 1 loads its programs and the evaluation's (both done before); step 2 (killed
    # in it) has no compile of its own on record, nor the evaluation at step 2.
    load = 0.05
    assert resumed(True).progress.eta_seconds()[0] == pytest.approx(
        10.0 + 30.0 * load + 40.0 * load + 10.0 + 8.0)
    assert resumed(False).progress.eta_seconds() == (10.0 + 30.0 + 40.0 + 10.0 + 8.0, [])

    out = io.StringIO()
    again = resumed(True, out)
    bar = again.progress
    bar.status("RL 1/2: rollouts")
    assert "] 2/4  RL 1/2" in out.getvalue() and "?" not in out.getvalue()
    _unit(bar, clocks, "rl", 11.0, compiling=6.0)
    bar.update(3, "RL 1/2")
    _unit(bar, clocks, "rl", 11.0)
    bar.update(4, "RL 2/2")
    _unit(bar, clocks, "eval", 8.0, compiling=4.0)
    again.close()
    end = out.getvalue().split("\r")[-1]
    assert end.startswith("[" + "#" * 28 + "] 4/4  this run: steps 2 -> 4 (2 RLCR steps, "
                          "1 evaluation) in 0m40s, 0m10s of it compiling"), end


def test_lines_written_before_the_split_was_logged():
    """metrics.jsonl of older code has each unit's wall time only: a phase's first line is
    its first unit, compiling what it took beyond the later lines' mean; `time/compile_s`,
    where a line has it, splits that line."""
    units = history([{"phase": "sft_data"}, {"phase": "sft", "time/step_s": 54.0},
                     {"phase": "sft", "time/step_s": 2.0}, {"phase": "sft", "time/step_s": 4.0},
                     {"phase": "eval", "time/eval_s": 30.0},
                     {"phase": "rl", "time/step_s": 40.0, "time/compile_s": 25.0},
                     {"phase": "rl", "time/step_s": 16.0, "time/compile_s": 1.0}])
    assert units["sft"] == [Unit(3.0, 51.0, True), Unit(2.0, 0.0, False), Unit(4.0, 0.0, False)]
    assert units["eval"] == [Unit(30.0, 0.0, True)]
    assert units["rl"] == [Unit(15.0, 25.0, True), Unit(15.0, 1.0, False)]


def test_a_unit_never_compiles_longer_than_it_ran():
    clocks = FakeClocks()
    bar = ProgressBar(2, stream=io.StringIO(), clock=clocks.wall, compile_clock=clocks.compile)
    bar.plan({"rl": 2})
    bar.begin("rl")
    clocks.compiled += 50.0  # another thread compiled while this unit ran 5 s
    clocks.now += 5.0
    assert bar.record("rl") == (0.0, 5.0)


def test_compile_clock_counts_overlapping_spans_once():
    c = CompileClock()
    c.add(10.0, 12.0)  # a nested trace ends first
    c.add(20.0, 21.0)
    c.add(9.0, 15.0)   # then the outer compile around it
    assert c() == 6.0 + 1.0
    c.add(14.0, 20.5)  # bridges both
    assert c() == 21.0 - 9.0
    c.add(30.0, 30.5)
    assert c() == 12.5


def test_compile_clock_hears_jax_compiles():
    import jax.numpy as jnp
    clock = CompileClock.process()
    before = clock()
    jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())(jnp.ones((7, 13)))  # a new program
    assert clock() > before
    after = clock()
    jax.jit(jnp.cos)(jnp.ones(3))  # a new function compiles again ...
    again = clock()
    f = jax.jit(jnp.tan)
    f(jnp.ones(5))
    once = clock()
    f(jnp.ones(5))  # ... but a cached program's second call compiles nothing
    assert clock() == once and again > after


def test_first_runs_of_fresh_programs_are_not_extrapolated_over_later_evaluations():
    """The first evaluation compiles 3 programs (10 s of compile events each) whose first
    runs take 2 s more than the compile events say (reported by the engine as the calls'
    spans, which hold the events), and works 15 s; the later ones work 15 s. The spans count
    once with the events they hold, so the ETA after the first is 15 s per evaluation left,
    not 21 s."""
    clocks, compiled = FakeClocks(), CompileClock()
    bar = ProgressBar(3, stream=io.StringIO(), clock=clocks.wall, compile_clock=compiled)
    bar.plan({"eval": 3})
    bar.begin("eval")
    t = 5000.0  # the spans' own clock (time.time() in a run)
    for _ in range(3):
        compiled.add(t, t + 10.0)       # tracing, lowering, XLA compile: JAX's events
        compiled.add(t - 0.1, t + 12.0)  # the whole call that compiled, first run included
        clocks.now += 12.1
        t += 12.1
    clocks.now += 15.0
    assert bar.record("eval") == pytest.approx((15.0, 36.3))
    assert bar.eta_seconds()[0] == pytest.approx(2 * 15.0)
    _unit(bar, clocks, "eval", 15.0)
    assert bar.eta_seconds()[0] == pytest.approx(15.0)


def test_a_call_that_compiled_is_reported_once():
    spans = []
    run = FirstRuns(lambda a, b: spans.append((a, b)))
    f = jax.jit(lambda x: jnp.cos(x) * 7.0 - 2.0)
    run(f, jnp.ones(11))
    assert len(spans) == 1 and spans[0][1] >= spans[0][0]
    run(f, jnp.ones(11))  # compiled already: no wait, no report
    run(f, jnp.ones(12))  # a new shape is a new program
    assert len(spans) == 2
    assert float(FirstRuns()(f, jnp.zeros(11))[0]) == -2.0 + 7.0  # no hook: a plain call


def test_the_engine_reports_the_first_run_of_each_program_it_compiles():
    """A real engine with shapes no other test uses (3 slots, a 40-token window), so its
    programs compile here: each dispatch that compiled is reported, and together the reported
    calls hold all the compile events of the generation; the same turns again report none."""
    cfg = M.presets.get("tiny")
    spans = []
    eng = Engine(cfg, M.init_params(jax.random.key(0), cfg), num_slots=3, max_context=40,
                 steps_per_dispatch=3, prefill_chunk=16, page_size=8,
                 on_first_run=lambda a, b: spans.append((a, b)))
    events = CompileClock.process()

    def generate():
        slots = [eng.allocate() for _ in range(3)]
        eng.generate([TurnRequest(s, np.arange(5 + s, dtype=np.int32) % cfg.vocab_size, 6,
                                  SamplingParams(greedy=True)) for s in slots])
        for s in slots:
            eng.release(s)

    before = events()
    generate()
    compiled = events() - before
    assert len(spans) >= 2 and compiled > 0  # at least a prefill and a decode program
    assert sum(b - a for a, b in spans) >= compiled
    n = len(spans)
    generate()
    assert len(spans) == n


def test_status_redraws_the_line_with_a_note():
    out = io.StringIO()
    bar = ProgressBar(4, stream=out)
    bar.plan({"rl": 4})
    bar.update(1, "RL 1/4 reward 0.50")
    bar.status("evaluating")
    text = out.getvalue().split("\r")
    assert "RL 1/4 reward 0.50" in text[1]
    assert "evaluating" in text[2] and "ETA ~" in text[2]  # RLCR steps never timed: a guess
    assert len(text[2]) >= len(text[1])  # padded: no stale characters of the longer line


def test_the_eta_is_shown_to_the_nearest_second_and_scored_as_its_rounding_allows():
    """A forecast of 2.02 s reads 2 s (rounded up it read 3 s with 1.1 s left, outside 2x),
    one under a second reads 1 s while a unit still runs, nothing left 0 s; the benchmark
    scores a line by every time its display could stand for."""
    from experiments.bench.progress_eta import shown_range, within_2x
    clocks = FakeClocks()
    bar = ProgressBar(1, stream=io.StringIO(), clock=clocks.wall,
                      reference=_reference(("rl", 0, 2.02, 0.0)))
    bar.plan([("rl", 0)])
    bar.begin("rl")
    assert bar.eta() == "0m02s"
    clocks.work(1.6)
    assert bar.eta() == "0m01s"  # 0.42 s left
    clocks.work(1.0)
    assert bar.eta() == "0m00s"  # the unit ran past its forecast: nothing left is known
    assert shown_range("ETA 0m03s") == (2.5, 3.5) and shown_range("ETA 0m01s") == (0.0, 1.5)
    assert shown_range("ETA 1h05m") == (3900.0, 3960.0) and shown_range("no eta") is None
    assert within_2x("ETA 0m02s", 1.1) and not within_2x("ETA 0m03s", 1.1)
    assert within_2x("ETA 0m01s", 2.1) and not within_2x("ETA 0m01s", 3.1)
    assert within_2x("ETA 0m01s", 0.05) and not within_2x("ETA 0m05s", 1.5)


def test_mfu_only_against_a_known_device():
    assert peak_flops(jax.devices()[0].device_kind) is None  # the CPU: no MFU is logged
    assert peak_flops("NVIDIA H200") == 989e12
