"""NOTIFY is a hint: no durable write may fail because PostgreSQL's notification queue is full.

A listener that never reads (a session that ran LISTEN and then sits in a long
transaction) pins the queue's tail; once the queue is full, every transaction
that notifies fails at COMMIT with "too many notifications in the NOTIFY queue".
The real queue is 8 GB on PostgreSQL 14 to 16, too large to fill in a test, so
these tests make the test database's own ``pg_notify`` and
``pg_notification_queue_usage`` behave like a full queue (functions of the same
name in a schema searched before ``pg_catalog``) and check that every kind of
write still commits; and, with the real functions, that a listener still gets
the wake-ups.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections

import selvedge_django as sv
from selvedge_django.models import SignalMessage, WorkflowInstance
from selvedge_django.storage.wakeups import NOTIFY_CHANNEL
from selvedge_django.worker import Worker

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"
)

SCHEMA = "selvedge_full_notify_queue"


def _admin(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.fixture
def full_queue(tdb: None) -> Iterator[None]:
    """Every connection of the test database sees a NOTIFY queue that is full."""
    database = connection.ops.quote_name(str(connection.settings_dict["NAME"]))
    _admin(f"CREATE SCHEMA {SCHEMA}")
    _admin(
        f"CREATE FUNCTION {SCHEMA}.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'too many notifications in the NOTIFY queue'"
        " USING ERRCODE = 'program_limit_exceeded'; END $$"
    )
    _admin(
        f"CREATE FUNCTION {SCHEMA}.pg_notification_queue_usage() RETURNS double precision"
        " LANGUAGE sql AS 'SELECT 1.0::double precision'"
    )
    # pg_catalog named last: the functions above shadow the real ones for unqualified calls.
    _admin(f"ALTER DATABASE {database} SET search_path = {SCHEMA}, public, pg_catalog")
    connections.close_all()  # reconnect under the new search_path
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notification_queue_usage()")
            assert cursor.fetchone()[0] == 1.0
        yield
    finally:
        connections.close_all()
        _admin(f"ALTER DATABASE {database} RESET search_path")
        _admin(f"DROP SCHEMA {SCHEMA} CASCADE")
        connections.close_all()


def test_every_write_commits_while_the_notify_queue_is_full(full_queue: None) -> None:
    from django.db import transaction

    iid = sv.start_workflow("fault.flow", {"tag": "full"}, instance_id="full-queue")
    with transaction.atomic():  # the caller's transaction: the store's own NOTIFY path
        sv.signal(iid, "go", 1)
    sv.signal(iid, "go", 2)
    # A worker runs it to the end: leases, one-statement steps and the close all notify.
    with Worker(listen_notify=True):
        result = sv.wait_workflow(iid, timeout=60)
    assert result.status == "completed", result.error
    other = sv.start_workflow("fault.flow", {"tag": "cancel"}, instance_id="full-cancel")
    sv.cancel_workflow(other, "stop")
    assert WorkflowInstance.objects.get(instance_id=other).cancel_requested
    assert SignalMessage.objects.filter(instance_id=iid).count() == 2


def test_a_listener_still_gets_the_wake_ups_when_the_queue_has_room(tdb: None) -> None:
    import psycopg

    settings = connection.settings_dict
    params: dict[str, Any] = {
        "host": settings["HOST"],
        "port": settings["PORT"],
        "user": settings["USER"],
        "password": settings["PASSWORD"] or None,
        "dbname": settings["NAME"],
        "autocommit": True,
    }
    with psycopg.connect(**params) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        sv.start_workflow("fault.flow", {"tag": "room"}, instance_id="room")
        payloads = [note.payload for note in listener.notifies(timeout=10, stop_after=1)]
    assert payloads and payloads[0].endswith(" runnable")
