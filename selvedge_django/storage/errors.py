"""What a storage error means for the instance whose execution it ended.

An execution stops at the first store operation that fails (the engine cannot
know what was written) and the instance is dispatched again later, to replay.
An error that recurs on every replay must not turn that into a hot loop:

* a *data error* (the database refused a value: ``DataError``, an
  ``IntegrityError`` that no store operation recognised as a known conflict, a
  value out of range or that cannot be encoded) fails the same way on every
  try, so the instance is failed at once with
  :class:`~selvedge_django.exceptions.ExecutionStorageError`;
* anything else (``OperationalError``, a lost connection, a timeout) may pass:
  the instance is held back, twice as long after each consecutive error
  (``EXECUTION_ERROR_BACKOFF`` up to ``MAX_EXECUTION_ERROR_BACKOFF``), and the
  ``MAX_EXECUTION_ERRORS``-th error in a row fails it the same way.
"""

from __future__ import annotations

from django.db import DataError, IntegrityError

from ..conf import SelvedgeSettings

__all__ = ["backoff_delay", "describe", "is_data_error"]


# Errors that a retry cannot cure: the database (or its driver) refused a value.
# UnicodeError (a lone surrogate) is a ValueError; OverflowError is SQLite's answer to
# an integer beyond 64 bits. Known conflicts never get here: the store turns them
# into their own errors (a duplicate start, a recorded history key).
DATA_ERRORS: tuple[type[BaseException], ...] = (
    DataError,
    IntegrityError,
    ValueError,
    OverflowError,
)


def is_data_error(error: BaseException) -> bool:
    """Whether ``error`` would recur on every try (the instance fails at once)."""
    return isinstance(error, DATA_ERRORS)


def backoff_delay(settings: SelvedgeSettings, errors: int) -> float:
    """Seconds to hold an instance back after ``errors`` storage errors in a row (from 1)."""
    exponent = min(max(0, errors - 1), 60)
    return min(settings.max_execution_error_backoff, settings.execution_error_backoff * 2**exponent)


def describe(error: BaseException) -> str:
    """The error's type and message, as recorded on the instance and in its failure."""
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= 2000 else f"{text[:2000]}..."
