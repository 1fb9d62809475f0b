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


def test_eta_counts_work_compiles_and_evaluations_still_to_come():
    """A run of 5 SFT steps (2 s each), 2 evaluations (20 s) and 6 RLCR steps (10 s, then
    15 s). Each phase's first unit compiles (its cost is this process's, not extrapolated);
    a later unit that compiles a new batch shape makes every later unit of its phase carry
    the mean of such compiles; the unit in progress counts what is left of it."""
    clocks, out = FakeClocks(), io.StringIO()
    bar = ProgressBar(11, stream=out, clock=clocks.wall, compile_clock=clocks.compile)
    bar.plan({"sft": 5, "eval": 2, "rl": 6})
    assert bar.eta() == "SFT ? + EVAL ? + RL ?"
    _unit(bar, clocks, "sft", 2.0, compiling=104.0)  # the first step compiles for 104 s
    assert bar.eta_seconds() == (4 * 2.0, ["eval", "rl"])
    assert bar.eta() == "0m08s + EVAL ? + RL ?"
    assert bar.compile_s == 104.0
    for _ in range(4):
        _unit(bar, clocks, "sft", 2.0)
    _unit(bar, clocks, "eval", 20.0, compiling=60.0)
    assert bar.eta_seconds() == (1 * 20.0, ["rl"])
    _unit(bar, clocks, "rl", 10.0, compiling=356.0)  # RL step 1: the update step compiles
    assert bar.eta_seconds() == (5 * 10.0 + 20.0, [])
    assert bar.eta() == fmt_seconds(70)
    bar.update(6, "RL 1/6")
    line = out.getvalue().split("\r")[-1]
    assert "ETA 1m10s" in line and f"compiled {fmt_seconds(104 + 60 + 356)}" in line
    _unit(bar, clocks, "rl", 10.0, compiling=3.0)  # a new batch shape compiles mid-run
    assert bar.eta_seconds() == (4 * (10.0 + 3.0) + 20.0, [])
    # Steps lengthen as the organisation grows: the mean over the last `window` steps follows.
    for _ in range(3):
        _unit(bar, clocks, "rl", 15.0)
    assert bar.remaining == {"sft": 0, "eval": 1, "rl": 1}
    work, recompile = (2 * 10.0 + 3 * 15.0) / 5, 3.0 / 4  # RL steps 2-5 after the first
    assert bar.eta_seconds()[0] == pytest.approx(work + recompile + 20.0)
    bar.begin("rl")  # the last step, 5 s into its work: what is left of it
    clocks.work(5.0)
    assert bar.eta_seconds()[0] == pytest.approx(work - 5.0 + recompile + 20.0)
    clocks.work(30.0)  # running long: its work counts as done (never below 0); a compile
    assert bar.eta_seconds()[0] == pytest.approx(recompile + 20.0)  # may still come
    clocks.work(0.0, compiling=9.0)
    assert bar.eta_seconds()[0] == pytest.approx(20.0)
    bar.record("rl")
    _unit(bar, clocks, "eval", 20.0)
    assert bar.eta_seconds() == (0.0, []) and bar.eta() == "0m00s"
    assert bar.compile_s == 104.0 + 60.0 + 356.0 + 3.0 + 9.0


def test_a_resumed_run_knows_what_was_timed_before(tmp_path):
    """Telemetry writes each unit's work and compile seconds on its metrics line; a resumed
    run reads them back: its first line already counts the evaluations and the compiles of
    the phases it has not run yet (each phase's last first unit), the bar starts at the
    resumed step, and the end line says what this invocation did."""
    clocks = FakeClocks()
    first = Telemetry(str(tmp_path), total_steps=6, stream=io.StringIO(), clock=clocks.wall,
                      compile_clock=clocks.compile)
    bar = first.progress
    bar.plan({"sft": 2, "eval": 2, "rl": 4})
    for step, phase, work, compiling in [(1, "sft", 2.0, 50.0), (2, "sft", 2.0, 0.0),
                                         (2, "eval", 8.0, 40.0), (3, "rl", 10.0, 30.0),
                                         (4, "rl", 12.0, 0.0)]:
        _unit(bar, clocks, phase, work, compiling)
        first.log(step, {"phase": phase})
    first.close()
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["progress/work_s"], r["progress/compile_s"], r["progress/first"])
            for r in kept] == [(2.0, 50.0, True), (2.0, 0.0, False), (8.0, 40.0, True),
                               (10.0, 30.0, True), (12.0, 0.0, False)]

    # With the persistent compilation cache on, a resumed process loads its programs: 2
    # RLCR steps of 11 s plus what later RLCR steps compiled (0 s), an evaluation of 8 s.
    cached = Telemetry(str(tmp_path), resume_step=4, total_steps=6, stream=io.StringIO(),
                       clock=clocks.wall, compile_clock=clocks.compile, compile_cache=True)
    cached.progress.plan({"sft": 0, "eval": 1, "rl": 2})
    assert cached.progress.eta_seconds() == (2 * 11.0 + 8.0, [])
    _unit(cached.progress, clocks, "eval", 8.0, compiling=3.0)
    cached.log(5, {"phase": "eval"})
    again = Telemetry(str(tmp_path), resume_step=5, total_steps=6, stream=io.StringIO(),
                      clock=clocks.wall, compile_clock=clocks.compile, compile_cache=True)
    again.progress.plan({"eval": 1})  # a resumed process's first evaluation compiled 3 s
    assert again.progress.eta_seconds() == (8.0 + 3.0, [])
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])[
        "progress/resumed"] is True

    out = io.StringIO()
    resumed = Telemetry(str(tmp_path), resume_step=4, total_steps=6, stream=out,
                        clock=clocks.wall, compile_clock=clocks.compile, compile_cache=False)
    bar = resumed.progress
    bar.plan({"sft": 0, "eval": 1, "rl": 2})  # RLCR steps 3 and 4, the last evaluation
    # Without the cache: 2 RLCR steps of 11 s plus the RL programs' compile (30 s), an
    # evaluation of 8 s plus its compile (40 s): nothing is "?" after a resume.
    assert bar.eta_seconds() == (2 * 11.0 + 30.0 + 8.0 + 40.0, [])
    bar.status("RL 3/4: rollouts")
    assert "] 4/6  RL 3/4" in out.getvalue() and "?" not in out.getvalue()
    _unit(bar, clocks, "rl", 11.0, compiling=6.0)  # loaded from the persistent cache
    assert bar.eta_seconds() == (11.0 + 8.0 + 40.0, [])
    bar.update(5, "RL 3/4")
    _unit(bar, clocks, "rl", 11.0)
    bar.update(6, "RL 4/4")
    _unit(bar, clocks, "eval", 8.0, compiling=4.0)
    resumed.close()
    end = out.getvalue().split("\r")[-1]
    assert end.startswith("[" + "#" * 28 + "] 6/6  this run: steps 4 -> 6 (2 RLCR steps, "
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
    assert "evaluating" in text[2] and "RL ?" in text[2]
    assert len(text[2]) >= len(text[1])  # padded: no stale characters of the longer line


def test_mfu_only_against_a_known_device():
    assert peak_flops(jax.devices()[0].device_kind) is None  # the CPU: no MFU is logged
    assert peak_flops("NVIDIA H200") == 989e12
