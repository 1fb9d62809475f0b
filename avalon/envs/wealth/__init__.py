"""Environment 4: wealth (`env.py`), its tasks (`tasks.py`) and scripted teacher (`teacher.py`)."""

from avalon.envs.wealth.env import BET, RESEARCH, Wealth, WealthSession
from avalon.envs.wealth.tasks import WealthConfig, WealthTask

__all__ = ["BET", "RESEARCH", "Wealth", "WealthConfig", "WealthSession", "WealthTask"]
