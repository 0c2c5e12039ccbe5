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

from collections.abc import Callable
from typing import Any

from django.db import DataError, IntegrityError, ProgrammingError

from .. import exceptions as exc
from ..conf import SelvedgeSettings

__all__ = [
    "PooledPreparedStatementError",
    "RowBusy",
    "backoff_delay",
    "describe",
    "guard_prepared_statements",
    "is_data_error",
]


class RowBusy(Exception):
    """A write asked not to wait (``if_free``) found a row another transaction holds;
    it wrote nothing (the worker's group commit writes it alone then)."""

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"the row of instance {instance_id!r} is held by another transaction")
        self.instance_id = instance_id


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


# SQLSTATEs of a session that lacks the prepared statements its client made (26000,
# invalid_sql_statement_name: "prepared statement ... does not exist") or holds another
# client's under the same name (42P05, duplicate_prepared_statement).
PREPARED_STATEMENT_STATES = frozenset({"26000", "42P05"})

PREPARED_STATEMENT_ADVICE = (
    "a prepared statement was missing from the database session this statement ran in"
    " ({error}): a connection pooler in transaction mode (pgbouncer before 1.21) cannot"
    " keep prepared statements, since each transaction may run in another server session."
    " Turn them off for this alias: SELVEDGE['PREPARED_STATEMENTS'] = False for the"
    " engine's own statements, and remove server_side_binding and prepare_threshold from"
    " its OPTIONS if they are set; or connect to PostgreSQL directly, or use pgbouncer 1.21"
    " or later with max_prepared_statements set above 0 (see docs/deployment.md)."
)


class PooledPreparedStatementError(exc.PreparedStatementError, ProgrammingError):
    """:class:`~selvedge_django.exceptions.PreparedStatementError` as the database error it is."""


def guard_prepared_statements(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """An execute wrapper: a statement that failed for a prepared statement its session
    does not have raises :class:`PooledPreparedStatementError`, which says why."""
    try:
        return execute(sql, params, many, context)
    except ProgrammingError as error:
        if getattr(error.__cause__, "sqlstate", None) not in PREPARED_STATEMENT_STATES:
            raise
        raise PooledPreparedStatementError(PREPARED_STATEMENT_ADVICE.format(error=error)) from error
