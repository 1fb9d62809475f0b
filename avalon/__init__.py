"""Avalon: reinforcement learning from collective rewards (RLCR) in JAX."""

__version__ = "0.1.0"
