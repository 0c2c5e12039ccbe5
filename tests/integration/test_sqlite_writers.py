"""SQLite write transactions of one process take turns, within the busy timeout.

Real threads on the real test database file: one holds a write transaction, others
wait for it the way a worker's threads do.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import OperationalError, connection, connections

from selvedge_django.conf import get_settings
from selvedge_django.engine.codec import Codec
from selvedge_django.storage import store_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single writer only"),
]


def _store() -> Any:
    return store_for("default", Codec(), get_settings())


def _with_timeout(seconds: float) -> None:
    """Give this thread's connection a busy timeout of its own (a new connection)."""
    conn = connections["default"]
    conn.close()
    settings = dict(conn.settings_dict)
    settings["OPTIONS"] = {**settings.get("OPTIONS", {}), "timeout": seconds}
    conn.settings_dict = settings


def _hold_write_lock(ready: threading.Event, release: threading.Event) -> threading.Thread:
    def hold() -> None:
        try:
            with _store().atomic():
                ready.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert ready.wait(10)
    return thread


def test_writers_of_one_process_each_commit_once_in_turn(tdb: None) -> None:
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    order: list[int] = []
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            with _store().atomic():
                order.append(n)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connections.close_all()

    writers = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in writers:
        thread.start()
    release.set()
    holder.join(10)
    for thread in writers:
        thread.join(30)
    assert errors == [] and sorted(order) == list(range(8))


def test_waiting_for_the_turn_counts_against_the_busy_timeout(tdb: None) -> None:
    """A writer behind a transaction held past the busy timeout fails after about that
    timeout once (the turn's wait is not added to SQLite's own wait)."""
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    outcome: dict[str, Any] = {}

    def write() -> None:
        _with_timeout(2)
        began = time.monotonic()
        try:
            with _store().atomic():
                outcome["wrote"] = True
        except OperationalError as error:
            outcome["error"] = str(error)
        finally:
            outcome["waited"] = time.monotonic() - began
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(30)
    release.set()
    holder.join(10)
    assert "database is locked" in outcome.get("error", ""), outcome
    # 2 s of turn and nothing left for SQLite; without the shortening it waited 4 s.
    assert 1.9 <= outcome["waited"] < 3.5, outcome
