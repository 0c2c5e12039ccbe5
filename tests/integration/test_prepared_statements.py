"""The engine's own statements are prepared on PostgreSQL, and only they.

With ``DATABASES`` as Django sets it up (client-side binding, nothing prepared), the
engine's hand-written statements still bind on the server and the connection
prepares them once they repeat (``SELVEDGE["PREPARED_STATEMENTS"]``, on by default);
the project's statements on the same connection are left alone, and the setting
turns the engine's off. What PostgreSQL itself lists in ``pg_prepared_statements``
for the session is what is checked. tests/processes/test_pgbouncer.py runs the same
through a pgbouncer in transaction mode, on and off.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance

pytestmark = [
    pytest.mark.usefixtures("tdb"),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
    ),
    pytest.mark.skipif(
        bool((connection.settings_dict.get("OPTIONS") or {}).get("server_side_binding")),
        reason="the project's OPTIONS bind on the server: they decide what is prepared",
    ),
]


@sv.workflow(name="test.prepared.echo")
def echo(ctx: sv.WorkflowContext, data: Any) -> Any:
    return data


def prepared() -> list[str]:
    """The statements this thread's session has prepared (PostgreSQL's own list)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [str(row[0]) for row in cursor.fetchall()]


def fresh_session() -> None:
    """Start from a new connection, which has prepared nothing."""
    connections["default"].close()


def test_the_engines_statements_are_prepared_and_the_projects_are_not() -> None:
    fresh_session()
    table = WorkflowInstance._meta.db_table
    for n in range(8):
        sv.start_workflow(echo, n)
        # The project's own query, the same text every time, on the same connection.
        assert WorkflowInstance.objects.filter(workflow_name="test.prepared.echo").count() == n + 1
    statements = prepared()
    starts = [s for s in statements if f'INSERT INTO "{table}"' in s]
    assert len(starts) == 1, statements  # the start's statement (insert, NOTIFY), prepared once
    assert "$1" in starts[0]  # bound on the server
    assert not [s for s in statements if s.startswith("SELECT COUNT(*)")], statements


def test_a_statement_run_once_is_not_prepared() -> None:
    fresh_session()
    sv.start_workflow(echo, "once")
    assert prepared() == []


def test_prepared_statements_off_prepares_nothing(worker: Any) -> None:
    fresh_session()
    with override_settings(SELVEDGE={**_selvedge(), "PREPARED_STATEMENTS": False}):
        ids = [sv.start_workflow(echo, n) for n in range(8)]
        assert prepared() == []
    for n, instance_id in enumerate(ids):
        assert sv.wait_workflow(instance_id, timeout=30).output == n


def test_prepared_statements_survive_a_rolled_back_transaction(worker: Any) -> None:
    """psycopg forgets its prepared statements when a transaction rolls back; the next
    engine statement prepares again and the run goes on."""
    fresh_session()
    for n in range(6):
        sv.start_workflow(echo, n)
    with pytest.raises(RuntimeError), transaction.atomic():
        sv.start_workflow(echo, "rolled back", instance_id="prepared-rolled-back")
        raise RuntimeError("roll back")
    ids = [sv.start_workflow(echo, n) for n in range(8)]
    for n, instance_id in enumerate(ids):
        assert sv.wait_workflow(instance_id, timeout=30).output == n
    assert not WorkflowInstance.objects.filter(instance_id="prepared-rolled-back").exists()
    table = WorkflowInstance._meta.db_table
    assert [s for s in prepared() if s.startswith(f'INSERT INTO "{table}"')], prepared()


def _selvedge() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.SELVEDGE)


def test_a_long_statements_placeholders_are_converted_once_and_bind_each_runs_values() -> None:
    # psycopg keeps its conversion of %(name)s into $1... only for statements under
    # 4 KB with at most 50 values; the engine's cursor keeps those of its own longer
    # ones (an inline step's reservation is), and each run still binds its own values.
    from selvedge_django.engine.codec import Codec
    from selvedge_django.storage import store_for
    from selvedge_django.storage.postgresql.cursor import CACHED_STATEMENTS

    db = store_for("default", Codec()).db
    names = [f"v{n}" for n in range(60)]  # over psycopg's 50 values
    padding = " ".join(f"/* {'x' * 70} */" for _ in range(60))  # over its 4 KB
    statement = f"SELECT {', '.join(f'%({name})s::int' for name in names)} {padding}"
    assert len(statement) > 4096
    converted, rows = [], []
    with db._cursor() as cursor:
        for run in range(3):
            cursor.execute(statement, {name: run * 100 + n for n, name in enumerate(names)})
            rows.append(cursor.fetchone())
            converted.append(cursor.cursor._query.query)
    assert [row[:2] for row in rows] == [(0, 1), (100, 101), (200, 201)]
    assert rows[2][59] == 259
    assert converted[0] is converted[1] is converted[2]  # converted once, then kept
    assert b"$60" in converted[0] and b"%(" not in converted[0]

    # The kept conversions are bounded: the oldest goes first.
    with db._cursor() as cursor:
        for n in range(CACHED_STATEMENTS):
            cursor.execute(f"SELECT %(a)s::int + {n}", {"a": 1})
        cursor.execute(statement, {name: 7 for name in names})
        assert cursor.cursor._query.query is not converted[0]
        assert cursor.fetchone()[59] == 7
