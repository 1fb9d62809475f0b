"""The wall-clock cap curriculum (SPEC §4): "2 hours rising to just over 5 hours by step 200".

Our reading: linear in the training step, from `start_s` at step 0 to `end_s` at `ramp_steps`,
constant after:

    cap(step) = start_s + (end_s - start_s) * min(step, ramp_steps) / ramp_steps

`real()` is 7200 s -> 18360 s (5.1 h, "just over 5") over 200 steps. `toy()` keeps the shape
scaled for the parallel-subtasks toy environment: 300 s -> 765 s (5 minutes to 12.75 minutes,
the same 2.55 ratio), over `ramp_steps` steps (200 by default; a short toy run passes fewer).

Each environment keeps its own clock: rollouts of training step s run under the environment's
default clock (its task's `wall_clock_s`) times `ratio(s) = cap(s) / start_s`, so a 5-minute
toy task and a 20-minute build grow by the same factor instead of sharing one cap. `cap` itself
is the reference clock the ratio is taken from (logged as `clock_s`).

The schedule has no state of its own: it is a function of the step the training checkpoint
already holds (`state()` returns its fields, for the record).
"""

from __future__ import annotations

import dataclasses

REAL_START_S = 2 * 3600.0
REAL_END_S = 5.1 * 3600.0
REAL_RAMP_STEPS = 200


@dataclasses.dataclass(frozen=True)
class ClockSchedule:
    start_s: float = REAL_START_S
    end_s: float = REAL_END_S
    ramp_steps: int = REAL_RAMP_STEPS

    def __post_init__(self):
        if not self.start_s > 0:
            raise ValueError(f"ClockSchedule.start_s must be > 0, got {self.start_s}")
        if not self.end_s >= self.start_s:
            raise ValueError(f"ClockSchedule.end_s must be >= start_s ({self.start_s}), got "
                             f"{self.end_s}")
        if isinstance(self.ramp_steps, bool) or not isinstance(self.ramp_steps, int) or \
                self.ramp_steps < 1:
            raise ValueError(f"ClockSchedule.ramp_steps must be an int >= 1, got "
                             f"{self.ramp_steps!r}")

    @classmethod
    def real(cls) -> ClockSchedule:
        return cls()

    @classmethod
    def toy(cls, ramp_steps: int = REAL_RAMP_STEPS) -> ClockSchedule:
        scale = 300.0 / REAL_START_S
        return cls(REAL_START_S * scale, REAL_END_S * scale, ramp_steps)

    def __call__(self, step: int) -> float:
        """The wall-clock cap, in seconds, for rollouts of training step `step`."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"ClockSchedule step must be an int >= 0, got {step!r}")
        frac = min(step, self.ramp_steps) / self.ramp_steps
        return self.start_s + (self.end_s - self.start_s) * frac

    def ratio(self, step: int) -> float:
        """The factor every environment's own clock is scaled by at `step` (1 at step 0)."""
        return self(step) / self.start_s

    def state(self) -> dict:
        return dataclasses.asdict(self)
