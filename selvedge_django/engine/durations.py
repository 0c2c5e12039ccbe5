"""Duration parsing shared by settings, activity options and workflow waits."""

from __future__ import annotations

import math
from datetime import timedelta

from .. import exceptions as exc

__all__ = [
    "MAX_DURATION_SECONDS",
    "Duration",
    "execution_timeout_ms",
    "optional_seconds",
    "to_seconds",
]

Duration = int | float | timedelta

#: The longest duration accepted anywhere (100 years): every duration reaches the
#: database as milliseconds in a BIGINT column or as a date, and a longer one would
#: overflow them (on every replay of the workflow that asked for it).
MAX_DURATION_SECONDS = 100 * 366 * 86400


def to_seconds(value: object, what: str, *, allow_nonpositive: bool = False) -> float:
    """Return ``value`` as float seconds, or raise TypeError/ValueError naming ``what``.

    Durations are at most ``MAX_DURATION_SECONDS``; nonpositive ones only with
    ``allow_nonpositive`` (a wait that expires at once).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise TypeError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be a finite duration, not {value!r}")
    if not allow_nonpositive and seconds <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(
            f"{what} must be at most 100 years ({MAX_DURATION_SECONDS} seconds), not {value!r}"
        )
    return seconds


def optional_seconds(value: object, what: str) -> float | None:
    """Like :func:`to_seconds`, but None stays None."""
    if value is None:
        return None
    return to_seconds(value, what)


def execution_timeout_ms(value: object, what: str = "execution_timeout") -> int | None:
    """A start's execution timeout as whole milliseconds (at least 1); None stays None.

    Raises :class:`~selvedge_django.exceptions.WorkflowStartRejected` (the start's
    typed error, nothing written) for a value :func:`to_seconds` refuses: not a
    number of seconds or a timedelta, not finite, not positive, over 100 years.
    """
    if value is None:
        return None
    try:
        seconds = to_seconds(value, what)
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(str(error)) from error
    return max(1, round(seconds * 1000))
