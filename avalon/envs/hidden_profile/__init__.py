"""Environment 2: hidden profile (`env.py`), its tasks (`tasks.py`) and scripted teacher
(`teacher.py`)."""

from avalon.envs.hidden_profile.env import CHOOSE, HiddenProfile, ProfileConfig, ProfileSession
from avalon.envs.hidden_profile.tasks import Fact, ProfileTask, best_option, scores

__all__ = ["CHOOSE", "Fact", "HiddenProfile", "ProfileConfig", "ProfileSession", "ProfileTask",
           "best_option", "scores"]
