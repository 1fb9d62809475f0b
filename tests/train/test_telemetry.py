"""The console: an ETA per phase from measured unit times, status notes, MFU only on known
devices."""

import io

import jax

from avalon.train.telemetry import CompileClock, ProgressBar, fmt_seconds, peak_flops


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


def test_eta_is_the_known_remaining_work_at_post_compile_step_times():
    """A run of 5 SFT steps (2 s each), 2 evaluations (20 s) and 6 RLCR steps (10 s, then
    15 s): whatever the compiles cost, the ETA after each unit is the remaining units times
    the steady step time of each phase, and compilation is its own phase."""
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
    # What the issue saw: 6m06s after RL step 1 with ~1.5 min left. Now 5 x 10 s + 20 s.
    assert bar.eta_seconds() == (5 * 10.0 + 20.0, [])
    assert bar.eta() == fmt_seconds(70)
    bar.update(6, "RL 1/6")
    line = out.getvalue().split("\r")[-1]
    assert "ETA 1m10s" in line and f"compiled {fmt_seconds(104 + 60 + 356)}" in line
    _unit(bar, clocks, "rl", 10.0, compiling=3.0)  # a new batch shape compiles mid-run
    assert bar.eta_seconds() == (4 * 10.0 + 20.0, [])
    # Steps lengthen as the organisation grows: the mean over the last `window` steps follows.
    for _ in range(3):
        _unit(bar, clocks, "rl", 15.0)
    assert bar.remaining == {"sft": 0, "eval": 1, "rl": 1}
    assert bar.eta_seconds()[0] == 1 * (2 * 10.0 + 3 * 15.0) / 5 + 20.0
    _unit(bar, clocks, "rl", 15.0)
    _unit(bar, clocks, "eval", 20.0)
    assert bar.eta_seconds() == (0.0, []) and bar.eta() == "0m00s"
    assert bar.compile_s == 104.0 + 60.0 + 356.0 + 3.0


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
