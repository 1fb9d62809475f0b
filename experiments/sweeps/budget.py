"""The organisation budget sweep (the report's budget sweep: b = 0..8 hires), in two forms.

    # one trained organisation evaluated at budgets 0..8 (the report's measurement)
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py:from=runs/toy \\
        --workdir=runs/budget_eval
    # one training run per budget (9 toy runs)
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py --workdir=runs/budget
    python -m experiments.sweeps.run --sweep=experiments/sweeps/budget.py:smoke --workdir=/tmp/b

`from=RUN` (a trained run directory of the same config): every run is evaluation only
(`init_from=RUN`, 0 SFT + 0 RLCR steps) of RUN's newest params, with the held-out organisation
arm at budget b beside the single agent on the same tasks. This is how the report reads its
budget numbers (one model trained with budgets sampled up to 8, evaluated with 1 or 8
specialists); budgets above the ones RUN trained with show whether it uses head-count it never
saw. The training form trains each budget from scratch: rollouts with budgets drawn up to b
(`budget.max_budget`), the held-out organisation arm at b (`eval.budget`; the single agent
always 0), and the engine with the slots a step needs (groups x K x (1 + b)). Budget 0 trains
single agents only (`p_single=1`: the sampler's maximum must stay >= 1). `smoke` runs the toy's
smoke config at budgets 0, 1 and 3 (`smoke,from=RUN` evaluates a smoke-config run).
"""

from __future__ import annotations

from experiments.sweeps.sweep import Sweep, evaluation_only, smoke_and_source

TOY_GROUPS, TOY_K = 4, 8  # configs/toy_org.py: rollout.groups_per_step, rollouts_per_group
SMOKE_GROUPS, SMOKE_K = 2, 4
BUDGETS, SMOKE_BUDGETS = tuple(range(9)), (0, 1, 3)


def budget_run(b: int, groups: int, k: int) -> dict:
    if b == 0:
        return {"eval.budget": 0, "budget.max_budget": 1, "budget.p_single": 1.0}
    return {"eval.budget": b, "budget.max_budget": b,
            "engine.slots": max(128, groups * k * (1 + b))}


def eval_run(b: int) -> dict:
    # The evaluation holds as many tasks at once as the slots allow, so the toy's 128 do.
    # `budget.max_budget` only bounds `eval.budget` here (no rollout is sampled).
    return {"eval.budget": b, "budget.max_budget": max(1, b)}


def get_sweep(arg: str = "") -> Sweep:
    smoke, source = smoke_and_source(arg, "budget sweep")
    config = "configs/toy_org.py:smoke" if smoke else "configs/toy_org.py"
    budgets = SMOKE_BUDGETS if smoke else BUDGETS
    if source:
        return Sweep(config=config, x="eval.budget", runs=tuple(eval_run(b) for b in budgets),
                     shared=evaluation_only(source))
    groups, k = (SMOKE_GROUPS, SMOKE_K) if smoke else (TOY_GROUPS, TOY_K)
    return Sweep(config=config, x="eval.budget",
                 runs=tuple(budget_run(b, groups, k) for b in budgets))
