"""The slot engine: admit, prefill, decode, fork, release, sampling (see `engine.py`)."""

from avalon.inference.api import EngineStats, SamplingParams, StopReason, TurnRequest, TurnResult
from avalon.inference.engine import Engine

__all__ = ["Engine", "EngineStats", "SamplingParams", "StopReason", "TurnRequest", "TurnResult"]
