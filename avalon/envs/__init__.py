"""Environments: the interface (in-process and over ORS), the environments, curricula, samplers.

- `base.py`: `Environment`, `Split`, `TaskTable` (deterministic, non-overlapping splits).
- `table.py`: `TableEnv` / `TieredEnv`, what the environments over task tables share (ids,
  specs, tasks, sessions, and difficulty tiers for those that take them).
- `ors.py` / `ors_server.py` / `serve.py`: the Open Reward Standard, Avalon's one wire
  protocol: `OrsEnvironment` (any ORS server as an Environment) and Avalon's environments
  served as ORS (`python -m avalon.envs.serve`); between the two, the Avalon extension
  (docs/ors_extension.md) carries a whole `EnvSession` (`wire.py`: its JSON forms);
  `transport.py`: the hardened HTTP transport under the server.
- `teacher.py`: `TeacherPolicy`, the scripted organisations behind each `env.teacher(...)`.
- `parallel/` (1: parallel subtasks under a clock, the toy organisation's environment),
  `hidden_profile/` (2), `software/` (3: software build, hardened grader), `wealth/` (4: GKPO),
  `verification/` (5: collective verification: hidden defects only a teammate's review finds).
- `openspiel/`: any OpenSpiel game as an environment, each seat an agent (the `games` extra;
  not imported here, so the package needs no OpenSpiel), its social dilemmas as a measurement.
- `safety/`: the 11 safety and co-operation scenarios of SPEC §5, played by no-CEO teams
  (`avalon/org/peers.py`); evaluation only (`experiments/safety/run.py`).
- `curriculum.py` (`ClockSchedule`), `samplers.py` (`LearningProgressSampler`, `BudgetSampler`).
- `tiers.py`: difficulty tiers below an environment's tasks (environments 1, 2 and 5 take
  them); `difficulty.py` (`DifficultySampler`): online difficulty filtering and tier promotion.
"""

from avalon.envs.base import Environment, Split, TaskTable, UnknownTaskError
from avalon.envs.curriculum import ClockSchedule
from avalon.envs.difficulty import DifficultyConfig, DifficultySampler
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.ors import EnvRequestError, EnvServerError, OrsEnvironment
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

__all__ = ["Baselines", "BudgetConfig", "BudgetSampler", "ClockSchedule", "DifficultyConfig",
           "DifficultySampler", "EnvRequestError",
           "EnvServerError", "Environment", "HiddenProfile", "HirePolicy",
           "LearningProgressSampler", "OrsEnvironment", "OrsServer",
           "ParallelConfig", "ParallelSubtasks",
           "ParallelTeacherConfig", "ProfileConfig", "ProgressConfig", "SoftwareBuild",
           "SoftwareConfig", "Split", "TaskTable", "TeacherPolicy", "UnknownTaskError",
           "Verification", "VerificationConfig", "Wealth", "WealthConfig"]
