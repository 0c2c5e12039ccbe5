"""A controllable clock: workflow time and the database clock, moved together by a test."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["ControllableClock", "installed_clock"]


class ControllableClock:
    """A clock that only moves when told to; callable like ``timezone.now``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = (start or datetime(2030, 1, 1, tzinfo=UTC)).astimezone(UTC)
        self._offset = timedelta(0)

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def now(self) -> datetime:
        return self()

    def advance(self, delta: timedelta | float) -> datetime:
        """Move workflow time and the database clock forward by ``delta``."""
        from ..storage.clock import set_clock_offset_ms

        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=float(delta))
        if delta < timedelta(0):
            raise ValueError("a ControllableClock only moves forward")
        with self._lock:
            self._now += delta
            self._offset += delta
            offset_ms = int(self._offset.total_seconds() * 1000)
        set_clock_offset_ms(offset_ms)
        return self()

    def reset_database_clock(self) -> None:
        from ..storage.clock import set_clock_offset_ms

        set_clock_offset_ms(0)


@contextlib.contextmanager
def installed_clock(start: datetime | None = None) -> Iterator[ControllableClock]:
    """Install a new ControllableClock as ``SELVEDGE["CLOCK"]`` for the block.

    On leaving, the settings are restored and the database clock is reset.
    """
    from django.conf import settings
    from django.test import override_settings

    clock = ControllableClock(start)
    raw: dict[str, Any] = dict(getattr(settings, "SELVEDGE", None) or {})
    raw["CLOCK"] = clock
    with override_settings(SELVEDGE=raw):
        try:
            yield clock
        finally:
            clock.reset_database_clock()
