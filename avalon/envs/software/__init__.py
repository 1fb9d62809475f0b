"""Environment 3: software build (`env.py`), its function families (`functions.py`), the
hardened grader (`grader.py`) and the scripted teacher (`teacher.py`)."""

from avalon.envs.software.env import (
    SUBMIT,
    SoftwareBuild,
    SoftwareConfig,
    SoftwareSession,
    SoftwareTask,
)
from avalon.envs.software.functions import BY_NAME, FAMILIES, Family
from avalon.envs.software.grader import GradeReport, grade, same

__all__ = ["BY_NAME", "FAMILIES", "SUBMIT", "Family", "GradeReport", "SoftwareBuild",
           "SoftwareConfig", "SoftwareSession", "SoftwareTask", "grade", "same"]
