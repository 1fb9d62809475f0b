"""The toy organisation's baselines (SPEC §5), as variants of `configs/toy_org.py`.

    # the organisation run, with S8, best-of-(budget+1) and a clock sweep at every evaluation
    python -m avalon.main --config=configs/toy_baselines.py:arms --workdir=runs/toy_arms
    # single-agent RL at matched compute: budget 0 throughout (SFT traces and RLCR), the same
    # steps, groups and K as the organisation run; evaluated against the same held-out tasks
    python -m avalon.main --config=configs/toy_baselines.py:single_rl --workdir=runs/toy_single
    python -m avalon.analyze runs/toy_arms runs/toy_single

Append ",smoke" (`arms,smoke`) for the toy's smoke sizes. "Matched compute" is our reading:
the same number of updates and sampled rollouts; a single agent writes fewer tokens per
rollout, so matching tokens instead would need more groups per step (`rollout.groups_per_step`).
"""

from __future__ import annotations

import ml_collections

from configs import toy_org

SWEEP_CLOCKS = (60.0, 150.0, 300.0, 600.0)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    parts = [p for p in arg.split(",") if p]
    smoke = "smoke" in parts
    variants = [p for p in parts if p != "smoke"]
    if len(variants) != 1 or variants[0] not in ("arms", "single_rl"):
        raise ValueError(f"configs/toy_baselines.py: the argument must be arms or single_rl "
                         f"(optionally ,smoke), got {arg!r}")
    c = toy_org.get_config("smoke" if smoke else "")
    if variants[0] == "arms":
        c.eval.s8 = True
        c.eval.best_of_k = c.eval.budget + 1  # k = budget + 1: the organisation's head-count
        c.eval.sweep_clocks = SWEEP_CLOCKS[:2] if smoke else SWEEP_CLOCKS
    else:
        c.budget.p_single = 1.0  # budget 0 for every SFT episode and every RLCR rollout
    return c
