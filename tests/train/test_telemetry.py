"""The console: an ETA per phase from measured unit times, status notes, MFU only on known
devices."""

import io

import jax

from avalon.train.telemetry import ProgressBar, fmt_seconds, peak_flops


def test_eta_never_extrapolates_one_phase_over_another():
    bar = ProgressBar(10, stream=io.StringIO())
    bar.plan({"sft": 4, "eval": 2, "rl": 6})
    assert bar.eta() == "SFT ? + EVAL ? + RL ?"
    bar.record("sft", 30.0)  # the first unit includes the compile
    bar.record("sft", 1.0)
    # 2 SFT steps left at the steady 1 s; nothing known yet about evaluation or RLCR.
    assert bar.eta() == "0m02s + EVAL ? + RL ?"
    bar.record("sft", 1.0)
    bar.record("sft", 1.0)
    bar.record("eval", 20.0)
    bar.record("rl", 50.0)
    assert bar.eta() == f"{fmt_seconds(20 + 5 * 50)}"
    bar.record("rl", 10.0)  # steady RL steps take 10 s: 4 left
    assert bar.eta() == f"{fmt_seconds(20 + 4 * 10)}"


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
