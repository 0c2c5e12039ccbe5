"""Testing helpers for projects that use selvedge_django (also a pytest plugin).

* :class:`ControllableClock` drives ``ctx.now()``, timer expiry and the database
  clock seen by leases, claims and task deadlines together: ``advance()`` moves
  them all, so a workflow that sleeps a week is tested in milliseconds.
* :func:`run_until_idle` runs a worker's loops in the calling thread until
  nothing is runnable.
* pytest fixtures ``selvedge_clock`` and ``selvedge_worker`` (this module is
  registered as a pytest plugin by the package).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["ControllableClock", "run_until_idle", "selvedge_clock", "selvedge_worker"]


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
        from .store import set_clock_offset_ms

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
        from .store import set_clock_offset_ms

        set_clock_offset_ms(0)


def run_until_idle(worker: Worker, max_rounds: int = 1000) -> int:
    """Run an unstarted worker's loops in this thread until a round does nothing.

    Executions and activity attempts run inline, one at a time, so a test can
    advance a :class:`ControllableClock` between calls and observe each step.
    Each round also records the activity timeouts that passed (the leader's
    sweep), so advancing past a deadline is seen here too. Returns the number of
    units of work done.
    """
    if worker.started:
        raise RuntimeError("run_until_idle drives an unstarted Worker")
    worker.resumptions.inline = True
    worker.activities.inline = True
    limit = worker.settings.max_workflows_per_batch
    total = 0
    for _ in range(max_rounds):
        done = sum(loop.run_once() for loop in worker.work_loops())
        done += worker.store.sweep_activity_timeouts(limit)
        total += done
        if done == 0:
            return total
    raise RuntimeError(f"still busy after {max_rounds} rounds")


@pytest.fixture
def selvedge_clock() -> Iterator[ControllableClock]:
    """A ControllableClock installed as the SELVEDGE CLOCK for the test."""
    from django.test import override_settings

    from .conf import get_settings

    clock = ControllableClock()
    raw: dict[str, Any] = dict(
        getattr(__import__("django.conf").conf.settings, "SELVEDGE", {}) or {}
    )
    raw["CLOCK"] = clock
    get_settings()
    with override_settings(SELVEDGE=raw):
        try:
            yield clock
        finally:
            clock.reset_database_clock()


@pytest.fixture
def selvedge_worker(transactional_db: None) -> Iterator[Worker]:
    """A started Worker on the test database, stopped after the test."""
    from .worker import Worker

    worker = Worker()
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Close LISTEN connections before the test database is dropped."""
    if nextitem is None:
        from .worker.notify import stop_listeners

        stop_listeners()
