"""The micro run's config with baselines at evaluation: a clock sweep and best-of-2."""

from __future__ import annotations

from tests.train import micro_config

make_environments = micro_config.make_environments
make_teacher = micro_config.make_teacher


def get_config(arg: str = ""):
    c = micro_config.get_config(arg)
    c.eval.sweep_clocks = (120.0,)
    c.eval.best_of_k = 2
    return c
