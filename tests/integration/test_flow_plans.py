"""The dispatch and claim statements walk the priority indexes (EXPLAIN on both databases).

Dispatch orders ready instances by ``ready_ms - 60000 * priority`` and claims order
queued tasks by ``not_before_ms - 60000 * priority``: expressions that partial
indexes store (``sv_inst_rank_idx``, ``sv_task_rank_idx``), so the common case
reads the first rows of an index instead of sorting every ready row. The
statements are captured as the store runs them, then explained on tables with a
backlog of ready rows: SQLite with statistics, PostgreSQL without (they would outlive
the rows) and with sorts priced out, which is what its statistics of a backlog make it
choose by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from selvedge_django.conf import get_settings
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.storage import store_for

# Rows of each table, and one in READY of them ready (runnable, or a queued task).
ROWS = 10_000
READY = 2


@pytest.fixture
def filled(tdb: None) -> Iterator[None]:
    now = timezone.now()
    instances = [
        WorkflowInstance(
            instance_id=f"i{n}",
            workflow_name=f"plans.wf{n % 5}",
            status="running" if n % READY == 0 else "completed",
            runnable=n % READY == 0,
            ready_ms=1_000_000 + n,
            priority=n % 7 - 3,
            started_at=now,
            updated_at=now,
        )
        for n in range(ROWS)
    ]
    WorkflowInstance.objects.bulk_create(instances, batch_size=500)
    tasks = [
        ActivityTask(
            instance_id=f"i{n}",
            workflow_name="plans.wf",
            key=f"k{n}",
            seq=1,
            name=f"plans.act{n % 3}",
            input="null",
            status="queued" if n % READY == 0 else "completed",
            not_before_ms=1_000_000 + n,
            priority=n % 5 - 2,
        )
        for n in range(ROWS)
    ]
    ActivityTask.objects.bulk_create(tasks, batch_size=500)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    # (No ANALYZE on PostgreSQL: its statistics outlive the rows and would change the plans
    # of later tests; plan() tells the planner what a backlog makes it choose by itself.)
    yield


def captured(run: Callable[[], Any], marker: str) -> tuple[str, Any]:
    """The first statement containing ``marker`` that ``run`` executes, with its values
    (a mapping for a statement bound by name)."""
    seen: list[tuple[str, Any]] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if marker in sql and not seen:
            seen.append((sql, params if isinstance(params, Mapping) else list(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        run()
    assert seen, f"no statement with {marker!r}"
    return seen[0]


def plan(statement: str, params: Any) -> str:
    sqlite = connection.vendor == "sqlite"
    with transaction.atomic(), connection.cursor() as cursor:
        if not sqlite:
            # What a backlog (with statistics) makes it choose: no sort of every ready row.
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + statement, params)
        return "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())


def no_table_scan(text: str) -> bool:
    """No sequential scan of a table (SQLite's SCAN of a table without an index)."""
    lines = text.splitlines()
    return not any(
        "Seq Scan" in line or ("SCAN selvedge" in line and "USING" not in line) for line in lines
    )


def walks(index: str, text: str) -> bool:
    """Whether the plan reads ``index`` in its order (no sort of every ready row)."""
    if connection.vendor == "sqlite":
        return f"USING INDEX {index}" in text and f"USING INDEX {index} (" not in text
    return f"Index Scan using {index}" in text


def test_dispatch_walks_the_priority_index(filled: None) -> None:
    store = store_for("default", Codec(), get_settings())
    statement, params = captured(
        lambda: store.instances.lease_batch("w", 30, 10, ["plans.wf0", "plans.wf1"]),
        "60000 * priority",
    )
    text = plan(statement, params)
    assert walks("sv_inst_rank_idx", text), text
    assert no_table_scan(text), text


def test_claims_walk_the_priority_index(filled: None) -> None:
    store = store_for("default", Codec(), get_settings())
    statement, params = captured(
        lambda: store.tasks.claim_tasks("w", 10, ["plans.act0", "plans.act1"]), "WITH n (name)"
    )
    text = plan(statement, params)
    assert walks("sv_task_rank_idx", text), text
    assert no_table_scan(text), text


def test_an_inline_claim_looks_for_a_task_before_it_through_an_index(filled: None) -> None:
    # Whether a due task of the queue comes first in claim order: SQLite reads the rank
    # index up to the task's own rank; PostgreSQL without statistics prefers the queue's
    # due-time index (sv_task_queue_idx), with them it may take either. Never a table scan.
    store = store_for("default", Codec(), get_settings())
    statement, params = captured(
        lambda: store.claim_task("i5000", "k5000", "w"), "NOT EXISTS (SELECT 1 FROM"
    )
    text = plan(statement, params)
    if connection.vendor == "sqlite":
        assert "USING INDEX sv_task_rank_idx (<expr><?)" in text, text
    else:
        assert "sv_task_rank_idx" in text or "sv_task_queue_idx" in text, text
    assert no_table_scan(text), text
