"""The database clock: leases, claims and task deadlines use it, never the local clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Func, IntegerField
from django.utils.dateparse import parse_datetime

from .. import exceptions as exc
from . import sql

__all__ = ["DbNowMs", "aware_utc", "aware_utc_ms", "clock_offset_ms", "set_clock_offset_ms"]


# Added to the database clock by every store in this process. Only
# selvedge_django.testing changes it, to move lease, claim and task deadlines
# forward without waiting.
_clock_offset_ms = 0


def set_clock_offset_ms(offset_ms: int) -> None:
    """Shift the database clock seen by this process's stores (tests only)."""
    global _clock_offset_ms
    _clock_offset_ms = int(offset_ms)


def clock_offset_ms() -> int:
    """The current shift of the database clock (see :func:`set_clock_offset_ms`)."""
    return _clock_offset_ms


class DbNowMs(Func):
    """The database clock in Unix milliseconds (plus a test offset).

    Compiled per database by Django (``as_postgresql``, ``as_sqlite``); any other
    database is rejected at start by the system checks and by ``store_for``.
    """

    output_field = IntegerField()

    def __init__(self, offset_ms: int = 0) -> None:
        super().__init__()
        self.offset_ms = int(offset_ms)

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:  # pragma: no cover - rejected at start by the system checks
        raise exc.SelvedgeError(f"unsupported database vendor {connection.vendor!r}")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        return sql.positional(sql.NOW_MS_POSTGRESQL), [self.offset_ms]

    def as_sqlite(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        return sql.positional(sql.NOW_MS_SQLITE), [self.offset_ms]


def aware_utc(value: Any) -> datetime:
    """A datetime column read by a hand-written statement, as an aware UTC datetime.

    SQLite returns the stored text (naive, UTC); PostgreSQL an aware datetime.
    """
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        value = parsed
    if not isinstance(value, datetime):
        raise ValueError(f"not a datetime: {value!r}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def aware_utc_ms(ms: int) -> datetime:
    """Unix milliseconds (the engine's clock columns) as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)
