"""The time-budget sweep (the report's: one organisation under 3 to 20 minutes of research
time), in two forms.

    # one trained organisation evaluated under caps of 2 to 20 minutes (the report's reading)
    python -m experiments.sweeps.run --sweep=experiments/sweeps/time_budget.py:from=runs/toy \
        --workdir=runs/time_budget_eval
    # one training run per cap
    python -m experiments.sweeps.run --sweep=experiments/sweeps/time_budget.py \
        --workdir=runs/time_budget

`from=RUN` (a trained run directory of the same config): every run is evaluation only
(`init_from=RUN`, 0 SFT + 0 RLCR steps) with `eval.clock_s = T`, read against the training
clock `clock.start_s` (the toy's 300 s): every environment's evaluation clock is its own
trained clock x T / 300, so the toy's 300-second environments get exactly T (verification,
trained at 480 s, gets 1.6 T), for both arms on the same tasks. The training form: cap T
seconds on every environment's own clock (`env.parallel_clock_s`, `env.profile_clock_s`,
`env.verification_clock_s`), with the training clock held at it (`clock.start_s = clock.end_s =
T`, so the curriculum scales nothing) and the evaluation clock at it (`eval.clock_s = T`: 1x
each environment's clock). The toy's subtasks take 1-3 minutes each, so at 2 minutes even a
full team finishes little, and at 20 minutes one agent finishes everything: the organisation's
advantage should peak in between. `smoke` runs the toy's smoke config at 2, 5 and 10 minutes
(`smoke,from=RUN` evaluates a smoke-config run).
"""

from __future__ import annotations

from experiments.sweeps.sweep import Sweep, evaluation_only, smoke_and_source

CAPS_S = (120.0, 180.0, 300.0, 450.0, 600.0, 900.0, 1200.0)


def clock_run(cap_s: float) -> dict:
    return {"eval.clock_s": cap_s, "clock.start_s": cap_s, "clock.end_s": cap_s,
            "env.parallel_clock_s": cap_s, "env.profile_clock_s": cap_s,
            "env.verification_clock_s": cap_s}


def get_sweep(arg: str = "") -> Sweep:
    smoke, source = smoke_and_source(arg, "time-budget sweep")
    config = "configs/toy_org.py:smoke" if smoke else "configs/toy_org.py"
    caps = (120.0, 300.0, 600.0) if smoke else CAPS_S
    if source:
        return Sweep(config=config, x="eval.clock_s",
                     runs=tuple({"eval.clock_s": c} for c in caps),
                     shared=evaluation_only(source))
    return Sweep(config=config, x="eval.clock_s", runs=tuple(clock_run(c) for c in caps))
