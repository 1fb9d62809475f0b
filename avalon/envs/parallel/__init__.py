"""Environment 1: parallel subtasks under a clock (`env.py`), its exact schedules
(`schedule.py`), tasks (`tasks.py`) and scripted teacher (`teacher.py`)."""

from avalon.envs.parallel.env import SOLVE, ParallelConfig, ParallelSession, ParallelSubtasks
from avalon.envs.parallel.schedule import Plan, best_headcount, horizon_units, max_solved, plan
from avalon.envs.parallel.tasks import Op, ParallelTask, Subtask
from avalon.envs.parallel.teacher import HirePolicy, ParallelTeacherConfig

__all__ = ["SOLVE", "HirePolicy", "Op", "ParallelConfig", "ParallelSession", "ParallelSubtasks",
           "ParallelTask", "ParallelTeacherConfig", "Plan", "Subtask", "best_headcount",
           "horizon_units", "max_solved", "plan"]
