"""A waiter's wake-up is sent after the write's commit, from a statement that writes nothing.

PostgreSQL takes one database-wide lock when a transaction that notified commits and
keeps it until that commit's WAL is flushed: notifying commits queue one behind the
other and cannot share a flush. A close wakes only ``wait_workflow`` callers, so the
engine sends it after the close commits, from a transaction of its own. These tests
record, for every ``pg_notify`` call, whether its transaction had written anything
(it has a transaction id then), through a function of that name in a schema searched
before ``pg_catalog`` that records the call and hands it to the real one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections

import selvedge_django as sv
from selvedge_django.worker import Worker

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"
)

SCHEMA = "selvedge_recorded_notify"


def _admin(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.fixture
def recorded(tdb: None) -> Iterator[None]:
    """Every pg_notify call of the test database is recorded with whether its
    transaction had written before it."""
    database = connection.ops.quote_name(str(connection.settings_dict["NAME"]))
    _admin(f"CREATE SCHEMA {SCHEMA}")
    _admin(f"CREATE TABLE {SCHEMA}.calls (id serial, payload text, had_written boolean)")
    _admin(
        f"CREATE FUNCTION {SCHEMA}.pg_notify(channel text, payload text) RETURNS void"
        " LANGUAGE plpgsql AS $$ DECLARE written boolean; BEGIN"
        " written := pg_current_xact_id_if_assigned() IS NOT NULL;"
        f" INSERT INTO {SCHEMA}.calls (payload, had_written) VALUES (payload, written);"
        " PERFORM pg_catalog.pg_notify(channel, payload); END $$"
    )
    _admin(f"ALTER DATABASE {database} SET search_path = {SCHEMA}, public, pg_catalog")
    connections.close_all()  # reconnect under the new search_path
    try:
        yield
    finally:
        connections.close_all()
        _admin(f"ALTER DATABASE {database} RESET search_path")
        _admin(f"DROP SCHEMA {SCHEMA} CASCADE")
        connections.close_all()


def _calls(topic: str) -> list[bool]:
    """had_written of each recorded NOTIFY of ``topic``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT had_written FROM {SCHEMA}.calls WHERE payload LIKE %s ORDER BY id",
            ["% " + topic],
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_close_wakes_its_waiters_from_a_transaction_that_wrote_nothing(
    recorded: None,
) -> None:
    iid = sv.start_workflow("fault.flow", {"tag": "hint"}, instance_id="hint-close")
    sv.signal(iid, "go", 1)
    sv.signal(iid, "go", 2)
    with Worker(listen_notify=True):
        result = sv.wait_workflow(iid, timeout=60)
    assert result.status == "completed", result.error
    # The close was announced once, and not by the transaction that wrote the close.
    assert _calls(f"closed:{iid}") == [False]
    # Work wake-ups still go out with the write that creates the work.
    assert _calls("runnable") and all(_calls("runnable"))


def test_an_operator_close_wakes_its_waiters_after_its_commit(recorded: None) -> None:
    iid = sv.start_workflow("fault.flow", {"tag": "hint"}, instance_id="hint-terminate")
    sv.terminate_workflow(iid, "stop")
    assert sv.wait_workflow(iid, timeout=10).status == "failed"  # terminated runs fail
    assert _calls(f"closed:{iid}") == [False]
