"""Avalon: reinforcement learning from collective rewards (RLCR) in JAX.

`SPEC §N` in a docstring or comment refers to section N of `docs/recipe.md` (the recipe as
Avalon reads it). The packages and the one direction of their imports: `docs/architecture.md`.
"""

__version__ = "0.1.0"
