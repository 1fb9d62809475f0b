"""Environment 5: collective verification (`env.py`) and its scripted teacher (`teacher.py`)."""

from avalon.envs.verification.env import (
    BUILD,
    REVIEW,
    SHIP,
    Verification,
    VerificationConfig,
    VerificationSession,
    VerificationTask,
)
from avalon.envs.verification.teacher import VerifyTeacherConfig

__all__ = ["BUILD", "REVIEW", "SHIP", "Verification", "VerificationConfig",
           "VerificationSession", "VerificationTask", "VerifyTeacherConfig"]
