"""Wake-ups of work and hints to waiters go out on two NOTIFY channels.

Workers listen on ``selvedge_wake`` (runnable instances, claimable tasks, armed
timers, paused queues); the client API's waits (``wait_workflow``, ``read_stream``)
on ``selvedge_hint`` (closes, stream entries). So a worker's listener is not woken
by every close of every other worker, nor a process that only waits by every new
piece of work. Checked with plain ``LISTEN`` connections on each channel, and with
the engine's own listeners.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django.storage.postgresql import listener as listeners
from selvedge_django.storage.wakeups import HINT_CHANNEL, NOTIFY_CHANNEL, Bus, Waker
from selvedge_django.worker import Worker

pytestmark = [
    pytest.mark.usefixtures("tdb"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"),
]


def _listening(channel: str) -> psycopg.Connection[Any]:
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(name, None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn


def _heard(conn: psycopg.Connection[Any], until: str, timeout: float = 10) -> list[str]:
    """The topics heard on ``conn`` up to and including the first that ends with ``until``."""
    topics: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for note in conn.notifies(timeout=0.2, stop_after=1):
            topics.append(note.payload.partition(" ")[2] or note.payload)
            if topics[-1].endswith(until):
                return topics
    raise AssertionError(f"{until!r} not heard within {timeout} s: {topics}")


@pytest.fixture
def channels() -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    wake, hint = _listening(NOTIFY_CHANNEL), _listening(HINT_CHANNEL)
    try:
        yield wake, hint
    finally:
        wake.close()
        hint.close()


def test_a_start_wakes_workers_and_its_close_hints_waiters(
    channels: tuple[psycopg.Connection[Any], psycopg.Connection[Any]],
) -> None:
    wake, hint = channels
    iid = sv.start_workflow("fault.flow", {"tag": "channels"}, instance_id="channels-close")
    sv.signal(iid, "go", 1)
    sv.signal(iid, "go", 2)
    with Worker(listen_notify=True):
        assert sv.wait_workflow(iid, timeout=60).status == "completed"
    heard = _heard(hint, f"closed:{iid}")  # its child's close first
    assert heard[-1] == f"closed:{iid}" and all(t.startswith("closed:") for t in heard), heard
    # The work channel heard the start and the signals, and the close did not go there:
    # a mark sent on it after the close is the next thing it hears after the work.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, 'mark')", [NOTIFY_CHANNEL])
    heard = _heard(wake, "mark")
    assert "runnable" in heard and not any(t.startswith("closed:") for t in heard), heard


def test_a_workers_listener_and_a_waiters_listener_each_hear_their_channel() -> None:
    worker_bus, waiter_bus = Bus(), Bus()
    worker = listeners.acquire_listener(connection.alias, worker_bus)
    waiter = listeners.ensure_listener(connection.alias, waiter_bus)
    try:
        assert worker is not waiter
        assert listeners.wait_until_connected(worker, 10)
        assert listeners.wait_until_connected(waiter, 10)
        wakers = {topic: (Waker(), Waker()) for topic in ("runnable", "closed:probe", "task")}
        for topic, (for_worker, for_waiter) in wakers.items():
            worker_bus.subscribe(topic, for_worker)
            waiter_bus.subscribe(topic, for_waiter)
        for pair in wakers.values():
            for waker in pair:
                waker.wait(0)  # forget the wake-ups of connecting
        # Three transactions (sent by hand: the payload is the topic). PostgreSQL delivers
        # notifications in commit order, and a listener relays them in that order.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, 'runnable')", [NOTIFY_CHANNEL])
            cursor.execute("SELECT pg_notify(%s, 'closed:probe')", [HINT_CHANNEL])
            cursor.execute("SELECT pg_notify(%s, 'task')", [NOTIFY_CHANNEL])
        # The worker heard the task, sent after the close: it would have heard the close.
        assert wakers["task"][0].wait(5)
        assert wakers["runnable"][0].wait(0) and not wakers["closed:probe"][0].wait(0)
        # The waiter heard the close, sent after the first work: it would have heard it.
        assert wakers["closed:probe"][1].wait(5)
        assert not wakers["runnable"][1].wait(0)
    finally:
        listeners.release_listener(worker)
        listeners.stop_listeners()


def test_a_start_outside_a_transaction_is_one_statement_that_wakes_the_workers(
    channels: tuple[psycopg.Connection[Any], psycopg.Connection[Any]],
) -> None:
    """No BEGIN and COMMIT around the insert and its NOTIFY: one round trip. A start whose
    id is taken writes nothing and wakes nobody."""
    from django.test.utils import CaptureQueriesContext

    from selvedge_django.models import WorkflowInstance

    wake, _ = channels
    with CaptureQueriesContext(connection) as queries:
        iid = sv.start_workflow("fault.flow", {"tag": "one"}, instance_id="one-statement")
    assert len(queries.captured_queries) == 1, queries.captured_queries
    assert "pg_notify" in queries.captured_queries[0]["sql"]
    assert _heard(wake, "runnable") == ["runnable"]
    assert WorkflowInstance.objects.get(instance_id=iid).runnable
    again = sv.start_workflow("fault.flow", {"tag": "one"}, instance_id=iid, if_exists="return")
    assert again == iid
    with connection.cursor() as cursor:  # the next thing the channel hears is this mark
        cursor.execute("SELECT pg_notify(%s, 'mark')", [NOTIFY_CHANNEL])
    assert _heard(wake, "mark") == ["mark"]
