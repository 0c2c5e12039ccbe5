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
from selvedge_django.models import (
    PAUSED_OWNER,
    ActivityTask,
    TimerSubscription,
    WorkflowInstance,
)
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


# -- pausing: paused instances, held tasks and timers are passed over through the indexes


def test_dispatch_passes_over_paused_instances_through_its_indexes(filled: None) -> None:
    # Half the ready instances paused: their lease belongs to the pause and never expires,
    # so neither dispatch part's index range holds them (no filter reads them one by one).
    ready = WorkflowInstance.objects.filter(status="running", runnable=True).order_by("instance_id")
    paused = list(ready.values_list("instance_id", flat=True)[: ROWS // READY // 2])
    WorkflowInstance.objects.filter(instance_id__in=paused).update(
        lease_owner=PAUSED_OWNER, lease_expires_ms=None
    )
    store = store_for("default", Codec(), get_settings())
    names = [f"plans.wf{n}" for n in range(5)]
    statement, params = captured(lambda: store.instances.lease_batch("w", 30, 10, names), "60000")
    text = plan(statement, params)
    assert walks("sv_inst_rank_idx", text), text
    assert no_table_scan(text), text
    leased = store.instances.lease_batch("w", 30, 500, names)
    assert leased and not {fence.instance_id for fence, _ in leased} & set(paused)


def test_claims_pass_over_held_tasks_on_the_priority_index(filled: None) -> None:
    queued = ActivityTask.objects.filter(status="queued").order_by("id")
    held = list(queued.values_list("id", flat=True)[: ROWS // READY // 2])
    ActivityTask.objects.filter(id__in=held).update(held=True)
    store = store_for("default", Codec(), get_settings())
    names = ["plans.act0", "plans.act1", "plans.act2"]
    statement, params = captured(lambda: store.tasks.claim_tasks("w", 10, names), "WITH n (name)")
    assert "held" in statement
    text = plan(statement, params)
    assert walks("sv_task_rank_idx", text), text
    assert no_table_scan(text), text
    claimed = store.tasks.claim_tasks("w", 50, names)
    assert len(claimed) == 50 and not {task.claim.task_id for task in claimed} & set(held)


def test_the_timer_poller_passes_over_held_timers_on_the_fire_index(filled: None) -> None:
    running = list(
        WorkflowInstance.objects.filter(status="running").values_list("instance_id", flat=True)
    )
    now = timezone.now()
    TimerSubscription.objects.bulk_create(
        [
            TimerSubscription(
                instance_id=iid,
                key=f"t{n}",
                expires_at=now,
                fire_at_ms=1_000 + n,
                held=n % 2 == 0,
            )
            for n, iid in enumerate(running)
        ],
        batch_size=500,
    )
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    store = store_for("default", Codec(), get_settings())
    statement, params = captured(lambda: store.waits.fire_due_timers(10), "LEFT JOIN")
    assert "held" in statement
    if connection.vendor == "postgresql":
        # (SQLite reads the timer table whole here, held or not: its partial index's
        # condition is "NOT fired" and the statement binds fired as a parameter.)
        text = plan(statement, params)
        assert "Index Scan using sv_timer_fire_idx" in text, text
        assert "Seq Scan on selvedge_django_timersubscription" not in text, text
    fired: list[tuple[str, str, str]] = []
    store.waits.fire_due_timers(50, fired=fired)
    assert len(fired) == 50 and all(int(key[1:]) % 2 == 1 for _, key, _ in fired)
