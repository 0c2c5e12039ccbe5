"""Duration parsing shared by settings, activity options and workflow waits."""

from __future__ import annotations

import math
from datetime import timedelta

__all__ = ["Duration", "optional_seconds", "to_seconds"]

Duration = int | float | timedelta


def to_seconds(value: object, what: str, *, allow_nonpositive: bool = False) -> float:
    """Return ``value`` as float seconds, or raise TypeError/ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise TypeError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be a finite duration, not {value!r}")
    if not allow_nonpositive and seconds <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return seconds


def optional_seconds(value: object, what: str) -> float | None:
    """Like :func:`to_seconds`, but None stays None."""
    if value is None:
        return None
    return to_seconds(value, what)
