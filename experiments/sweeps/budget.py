"""The organisation budget sweep: the toy organisation trained and evaluated at hire budgets
0..8 (the report's budget sweep), one run per budget.

    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py --workdir=runs/budget
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py:smoke --workdir=/tmp/b

Budget b: rollouts are trained with budgets drawn up to b (`budget.max_budget`), the held-out
organisation arm gets b (`eval.budget`; the single agent always 0), and the engine gets the
slots a step needs (groups x K x (1 + b)). Budget 0 trains single agents only (`p_single=1`:
the sampler's maximum must stay >= 1). `:smoke` runs the toy's smoke config at budgets 0, 1
and 3.
"""

from __future__ import annotations

from experiments.sweeps.sweep import Sweep

TOY_GROUPS, TOY_K = 4, 8  # configs/toy_org.py: rollout.groups_per_step, rollouts_per_group
SMOKE_GROUPS, SMOKE_K = 2, 4


def budget_run(b: int, groups: int, k: int) -> dict:
    if b == 0:
        return {"eval.budget": 0, "budget.max_budget": 1, "budget.p_single": 1.0}
    return {"eval.budget": b, "budget.max_budget": b,
            "engine.slots": max(128, groups * k * (1 + b))}


def get_sweep(arg: str = "") -> Sweep:
    if arg not in ("", "smoke"):
        raise ValueError(f"budget sweep argument {arg!r}: takes 'smoke' or none")
    if arg == "smoke":
        return Sweep(config="configs/toy_org.py:smoke", x="eval.budget",
                     runs=tuple(budget_run(b, SMOKE_GROUPS, SMOKE_K) for b in (0, 1, 3)))
    return Sweep(config="configs/toy_org.py", x="eval.budget",
                 runs=tuple(budget_run(b, TOY_GROUPS, TOY_K) for b in range(9)))
