"""One format for a refused configuration value: `Owner.field=value: why`, as a ValueError.

    check = FieldChecks("RLConfig")
    check.positive_int(cfg, "micro_batches")       # RLConfig.micro_batches=0: must be a ...
    check.fail("beta", cfg.beta, "must be > 0")    # any rule of the config's own
    check.fail_together({"lo": 2, "hi": 1}, "must be lo <= hi")  # RLConfig.lo=2, hi=1: ...

The configs of `avalon/model/`, `avalon/rl/`, `avalon/org/` and `avalon/envs/` validate through
this on construction (`train/config.py`'s command-line config too, as owner `config`), so a bad
value stops at start-up with one line naming the field and the value (the entry points print
it without a traceback: `avalon/command.py`). Nothing here knows any config.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import NoReturn


class FieldChecks:
    """The checks of one config class (`owner`, as the messages name it)."""

    def __init__(self, owner: str):
        self.owner = owner

    def fail(self, field: str, value, why: str) -> NoReturn:
        raise ValueError(f"{self.owner}.{field}={value!r}: {why}")

    def fail_together(self, values: dict, why: str) -> NoReturn:
        """A rule over several fields: `Owner.a=1, b=2: why`."""
        fields = ", ".join(f"{k}={v!r}" for k, v in values.items())
        raise ValueError(f"{self.owner}.{fields}: {why}")

    def is_enum(self, obj, field: str, enum_type: type[enum.Enum]) -> None:
        value = getattr(obj, field)
        if not isinstance(value, enum_type):
            self.fail(field, value, f"must be a {enum_type.__name__}")

    def is_bool(self, obj, field: str) -> None:
        value = getattr(obj, field)
        if not isinstance(value, bool):
            self.fail(field, value, "must be a bool")

    def positive_int(self, obj, field: str) -> int:
        value = getattr(obj, field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(field, value, "must be a positive integer")
        return value

    def int_at_least(self, obj, field: str, lo: int, why: str = "") -> int:
        value = getattr(obj, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            self.fail(field, value, f"must be an integer >= {lo}{' ' + why if why else ''}")
        return value

    def finite(self, obj, field: str) -> float:
        value = getattr(obj, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            self.fail(field, value, "must be a finite number")
        return value

    def one_of(self, obj, field: str, choices: Iterable[str]) -> None:
        choices = tuple(choices)
        value = getattr(obj, field)
        if value not in choices:
            self.fail(field, value, f"must be one of {', '.join(choices)}")

    def capacity_factor(self, obj, field: str) -> None:
        """An expert-parallel capacity factor (`model/moe_ep.py`): None (dropless) or a finite
        number >= 1."""
        value = getattr(obj, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 1.0):
            self.fail(field, value, "must be a finite number >= 1 (below 1 drops choices even "
                      "under a balanced load) or None (dropless)")
