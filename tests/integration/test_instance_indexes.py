"""The instance id is indexed once per table, and never for ``LIKE`` (migration 0025).

The history, task, timer, archive and stream tables each have a unique index leading
with the instance; the foreign key's own index (and on PostgreSQL its
``varchar_pattern_ops`` twin) repeated it and cost an entry on every row inserted.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowStream,
    WorkflowStreamEntry,
)

ONCE = (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    TimerSubscription,
    WorkflowStream,
    WorkflowStreamEntry,
)


def _indexes(model: Any) -> dict[str, dict[str, Any]]:
    with connection.cursor() as cursor:
        return {
            name: info
            for name, info in connection.introspection.get_constraints(
                cursor, model._meta.db_table
            ).items()
            if info["index"] or info["unique"]
        }


def _instance_only(model: Any) -> set[str]:
    """The indexes on instance_id alone that the model does not name (a foreign key's)."""
    named = {index.name for index in model._meta.indexes}
    return {
        name
        for name, info in _indexes(model).items()
        if info["columns"] == ["instance_id"] and not info["primary_key"] and name not in named
    }


@pytest.mark.parametrize("model", ONCE, ids=lambda model: model.__name__)
def test_the_instance_is_indexed_once_by_the_unique_index_leading_with_it(
    db: None, model: Any
) -> None:
    assert _instance_only(model) == set()
    leading = [
        info["columns"]
        for info in _indexes(model).values()
        if info["unique"] and info["columns"][:1] == ["instance_id"]
    ]
    assert len(leading) == 1 and len(leading[0]) >= 2


def test_the_signal_table_keeps_its_foreign_key_index(db: None) -> None:
    """No other index of the signal table covers all its rows: deleting an instance
    finds its signals through this one."""
    assert len(_instance_only(SignalMessage)) == 1


def _pattern_indexes() -> set[str]:
    """The tables with a ``varchar_pattern_ops`` index of the instance id (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_indexes WHERE schemaname = current_schema()"
            " AND indexdef LIKE %s",
            ["%(instance_id varchar_pattern_ops)"],
        )
        return {row[0] for row in cursor.fetchall()}


def test_no_instance_id_is_indexed_for_prefix_matches(db: None) -> None:
    """Nothing runs a case-sensitive ``LIKE 'prefix%'`` on an instance id: the admin and
    the operator reads search with ``icontains``."""
    assert _pattern_indexes() == set()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")
def test_a_lookup_by_instance_walks_the_unique_index(db: None) -> None:
    """What the dropped index served (all of an instance's rows, and the foreign key's
    check when an instance is deleted) is an index scan of the unique index."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for model in ONCE:
            table = connection.ops.quote_name(model._meta.db_table)
            cursor.execute(f"EXPLAIN SELECT 1 FROM {table} WHERE instance_id = 'x'")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            unique = [c.name for c in model._meta.constraints]
            assert any(name in plan for name in unique), plan


def test_the_migration_reverses_and_applies_again(transactional_db: None) -> None:
    postgresql = connection.vendor == "postgresql"
    call_command("migrate", "selvedge_django", "0024", verbosity=0)
    try:
        for model in ONCE:
            assert len(_instance_only(model)) == (2 if postgresql else 1)
        assert len(_instance_only(SignalMessage)) == (2 if postgresql else 1)
        assert len(_pattern_indexes()) == (8 if postgresql else 0)
    finally:
        call_command("migrate", "selvedge_django", verbosity=0)
    for model in ONCE:
        assert _instance_only(model) == set()
    assert len(_instance_only(SignalMessage)) == 1
    assert _pattern_indexes() == set()
