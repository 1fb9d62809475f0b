"""The time-budget sweep: the toy organisation trained and evaluated under wall-clock caps from
2 to 20 minutes (the report's time-budget sweep), one run per cap.

    python -m experiments.sweeps.run --sweep=experiments/sweeps/time_budget.py \\
        --workdir=runs/time_budget

Cap T seconds: every environment's own clock (`env.parallel_clock_s`, `env.profile_clock_s`,
`env.verification_clock_s`), with the training clock held at it (`clock.start_s = clock.end_s =
T`, so the curriculum scales nothing) and the evaluation clock at it (`eval.clock_s = T`, read
against `clock.start_s`: 1x each environment's clock). The toy's subtasks take 1-3
minutes each, so at 2 minutes even a full team finishes little, and at 20 minutes one agent
finishes everything: the organisation's advantage should peak in between. `:smoke` runs the
toy's smoke config at 2, 5 and 10 minutes.
"""

from __future__ import annotations

from experiments.sweeps.sweep import Sweep

CAPS_S = (120.0, 180.0, 300.0, 450.0, 600.0, 900.0, 1200.0)


def clock_run(cap_s: float) -> dict:
    return {"eval.clock_s": cap_s, "clock.start_s": cap_s, "clock.end_s": cap_s,
            "env.parallel_clock_s": cap_s, "env.profile_clock_s": cap_s,
            "env.verification_clock_s": cap_s}


def get_sweep(arg: str = "") -> Sweep:
    if arg not in ("", "smoke"):
        raise ValueError(f"time-budget sweep argument {arg!r}: takes 'smoke' or none")
    if arg == "smoke":
        return Sweep(config="configs/toy_org.py:smoke", x="eval.clock_s",
                     runs=tuple(clock_run(c) for c in (120.0, 300.0, 600.0)))
    return Sweep(config="configs/toy_org.py", x="eval.clock_s",
                 runs=tuple(clock_run(c) for c in CAPS_S))
