"""One lock order on every write path: the instance row first (an ancestor's first).

Activity completions, timer fires, signals, scope cancellations and closes all lock
the instance row before its tasks, timers and history rows, and a child's close
takes its parent's row before its own. Racing pairs then wait for each other but
never deadlock: the concurrency test counts PostgreSQL's deadlocks
(``pg_stat_database.deadlocks``) around a few hundred racing instances. On SQLite
(one writer at a time) the same workload checks the outcomes only.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.models import HistoryEvent, WorkflowInstance
from tests.conftest import wait_until

RACERS = 120  # instances per race, three races


@pytest.fixture
def racing_workflows() -> Iterator[None]:
    """Register the racing workflows for one test; unregistered afterwards."""

    @sv.activity(name="lockorder.quick")
    def quick(n: int) -> int:
        time.sleep(random.uniform(0, 0.004))
        return n

    @sv.workflow(name="lockorder.cancel_scope")
    def cancel_scope(ctx: sv.WorkflowContext, n: int) -> str:
        # The scope cancel (instance, history, tasks) races the completion (task,
        # history, instance before the fix) of an activity that is done at once.
        scoped, cancel = ctx.with_cancel()
        future = quick.execute_async(scoped, n)
        ctx.sleep(0.005)
        cancel()
        try:
            future.get(ctx)
            return "value"
        except sv.ScopeCancelled:
            return "cancelled"

    @sv.workflow(name="lockorder.close_early")
    def close_early(ctx: sv.WorkflowContext, n: int) -> str:
        # The close cancels the unfinished task while its completion arrives.
        quick.execute_async(ctx, n)
        quick.execute_async(ctx, n + 1)
        ctx.sleep(0.004)
        return "closed"

    @sv.workflow(name="lockorder.timed_receive")
    def timed_receive(ctx: sv.WorkflowContext, _: Any) -> str:
        # The timer fire (timers, history, instance before the fix) races the signal
        # observation (instance, signal, history, timer).
        try:
            return str(ctx.receive_with_timeout("poke", 0.05))
        except sv.ReceiveTimeout:
            return "timeout"

    yield
    for name in ("lockorder.cancel_scope", "lockorder.close_early", "lockorder.timed_receive"):
        registry.unregister(name, kind="workflow")
    registry.unregister("lockorder.quick", kind="activity")


def deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def other_sessions() -> int:
    """Backends on the test database other than this one and LISTEN connections."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query NOT ILIKE 'LISTEN%%'"
        )
        return int(cursor.fetchone()[0])


def test_racing_completions_cancels_closes_and_timer_fires_never_deadlock(
    make_worker: Callable[..., Any],
    racing_workflows: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    postgres = connection.vendor == "postgresql"
    before = deadlocks() if postgres else 0
    caplog.set_level(logging.WARNING, logger="selvedge_django")
    workers = [
        make_worker(
            worker_id=f"racer-{i}",
            timer_check_interval=0.01,
            max_concurrent_activities=8,
            max_concurrent_resumptions=8,
        )
        for i in range(2)
    ]
    ids: dict[str, list[str]] = {"cancel": [], "close": [], "receive": []}
    for n in range(RACERS):
        ids["cancel"].append(sv.start_workflow("lockorder.cancel_scope", n))
        ids["close"].append(sv.start_workflow("lockorder.close_early", n))
        ids["receive"].append(sv.start_workflow("lockorder.timed_receive", None))
    # Signals aimed at the moment the receives time out.
    time.sleep(0.04)
    for instance_id in ids["receive"]:
        try:
            sv.signal(instance_id, "poke", "poked")
        except sv.InstanceClosed:
            pass  # timed out and closed first
    every = [i for group in ids.values() for i in group]
    results = {i: sv.wait_workflow(i, timeout=120) for i in every}
    for worker in workers:
        worker.stop(timeout=10)

    assert {r.status for r in results.values()} == {"completed"}, [
        r.error for r in results.values() if r.status != "completed"
    ]
    assert {results[i].output for i in ids["cancel"]} <= {"value", "cancelled"}
    assert {results[i].output for i in ids["close"]} == {"closed"}
    assert {results[i].output for i in ids["receive"]} <= {"poked", "timeout"}
    assert not [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage().lower()]
    if postgres:
        # Backends flush their statistics when they end: wait for the workers' to end.
        wait_until(lambda: other_sessions() == 0, timeout=20)
        assert deadlocks() - before == 0


def test_a_child_closing_after_its_parent_leaves_the_parent_history_alone(
    worker: Any,
) -> None:
    parent = sv.start_workflow("child.leave_running", {"fail": False})
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == "completed"
    closed = WorkflowInstance.objects.get(instance_id=parent)
    child_rows = list(HistoryEvent.objects.filter(instance_id=parent, command="child"))
    assert len(child_rows) == 2 and all(r.data is None for r in child_rows)

    # The children (cancelled by the parent's close) close afterwards.
    for child_id in result.output:
        assert sv.wait_workflow(child_id, timeout=20).status == "cancelled"

    after = WorkflowInstance.objects.get(instance_id=parent)
    assert (after.status, after.runnable, after.updated_at) == (
        "completed",
        False,
        closed.updated_at,
    )
    child_rows = list(HistoryEvent.objects.filter(instance_id=parent, command="child"))
    assert [(r.event_type, r.data, r.arrived_at) for r in child_rows] == [
        ("Reserved", None, None)
    ] * 2
