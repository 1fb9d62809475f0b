"""Environments: the interface (in-process and HTTP), the environments, curricula, samplers.

- `base.py`: `Environment`, `Split`, `TaskTable` (deterministic, non-overlapping splits).
- `http_server.py` / `http_client.py`: any Environment served over loopback HTTP + JSON, and
  the client Environment whose sessions forward every call (`wire.py`: the JSON forms).
- `ors.py` / `ors_server.py` / `serve.py`: the Open Reward Standard: `OrsEnvironment` (any ORS
  server as an Environment) and Avalon's environments served as ORS (`python -m
  avalon.envs.serve`); `transport.py`: the hardened HTTP transport under both servers.
- `teacher.py`: `TeacherPolicy`, the scripted organisations behind each `env.teacher(...)`.
- `parallel/` (1: parallel subtasks under a clock, the toy organisation's environment),
  `hidden_profile/` (2), `software/` (3: software build, hardened grader), `wealth/` (4: GKPO),
  `verification/` (5: collective verification: hidden defects only a teammate's review finds).
- `safety/`: the 11 safety and co-operation scenarios of SPEC §5, played by no-CEO teams
  (`avalon/org/peers.py`); evaluation only (`experiments/safety/run.py`).
- `curriculum.py` (`ClockSchedule`), `samplers.py` (`LearningProgressSampler`, `BudgetSampler`).
"""

from avalon.envs.base import Environment, Split, TaskTable, UnknownTaskError
from avalon.envs.curriculum import ClockSchedule
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.http_client import EnvRequestError, EnvServerError, HttpEnvironment
from avalon.envs.http_server import EnvServer
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.envs.parallel import (
    HirePolicy,
    ParallelConfig,
    ParallelSubtasks,
    ParallelTeacherConfig,
)
from avalon.envs.samplers import (
    BudgetConfig,
    BudgetSampler,
    LearningProgressSampler,
    ProgressConfig,
)
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.teacher import Baselines, TeacherPolicy
from avalon.envs.verification import Verification, VerificationConfig
from avalon.envs.wealth import Wealth, WealthConfig

__all__ = ["Baselines", "BudgetConfig", "BudgetSampler", "ClockSchedule", "EnvRequestError",
           "EnvServer", "EnvServerError", "Environment", "HiddenProfile", "HirePolicy",
           "HttpEnvironment", "LearningProgressSampler", "OrsEnvironment", "OrsServer",
           "ParallelConfig", "ParallelSubtasks",
           "ParallelTeacherConfig", "ProfileConfig", "ProgressConfig", "SoftwareBuild",
           "SoftwareConfig", "Split", "TaskTable", "TeacherPolicy", "UnknownTaskError",
           "Verification", "VerificationConfig", "Wealth", "WealthConfig"]
