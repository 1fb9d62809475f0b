"""OpenSpiel's games as environments (`env.py`), with reference values and teacher policies
(`solve.py`), the scripted teacher (`teacher.py`) and the social dilemmas' co-operation counts
(`dilemmas.py`). Needs the `games` extra (`pip install -e '.[games]'`: open_spiel); nothing
else in `avalon.envs` imports this package."""

from avalon.envs.openspiel.env import DILEMMA_GAMES, OpenSpiel, OpenSpielConfig
from avalon.envs.openspiel.teacher import GameTeacherConfig

__all__ = ["DILEMMA_GAMES", "GameTeacherConfig", "OpenSpiel", "OpenSpielConfig"]
