"""How one attack ended, and the row the red-team table prints for it."""

import dataclasses
import enum
from collections.abc import Callable


class Outcome(enum.Enum):
    BLOCKED = "blocked"        # the attack had no effect (refused, killed, or contained)
    TOOL_ERROR = "tool error"  # the agent got a tool error (and its shaping); nothing else happened
    CRASH = "crash"            # an exception left the driver, server or restore; or it worked


@dataclasses.dataclass(frozen=True)
class Attack:
    """One attack: `run(tmp_dir)` performs it and returns its outcome and a one-line detail."""
    name: str
    run: Callable[[str], tuple[Outcome, str]]
