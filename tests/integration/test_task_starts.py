"""A task due now is enqueued with its activity recorded, and closed by its success.

``enqueue`` writes the instance, the activity's history reservation and its queued
task in one transaction, exactly as the ``selvedge.task`` workflow's first execution
would record them; the attempt that succeeds closes the instance in the transaction
that records its value (storage.sole_activity). No execution leases the instance
unless something else happens to it (a failure for good, a cancel request): then
the replay of the recorded command goes on as for any workflow.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

if (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is None
):
    pytest.skip("neither django.tasks nor the django-tasks backport", allow_module_level=True)

import selvedge_django as sv
from selvedge_django.engine.events import CLOSE_EVENT_BY_STATUS
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.tasks import compat
from selvedge_django.tasks.names import TASK_KEY, TASK_WORKFLOW
from selvedge_django.testing import FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.usefixtures("tdb", "task_calls")

Status = compat.TaskResultStatus
# What an execution of the instance would write (not the worker's own activity claim).
EXECUTION_WRITES = {"acquire", "load_snapshot", "reserve_activity", "close", "release_lease"}
TASK_COLUMNS = (
    "key",
    "seq",
    "name",
    "input",
    "queue",
    "options",
    "max_attempts",
    "priority",
    "schedule_to_start_ms",
    "start_to_close_ms",
    "heartbeat_timeout_ms",
    "concurrency_key",
    "max_concurrency",
    "status",
    "attempts",
    "failures",
)


def history(instance_id: str) -> list[tuple[Any, ...]]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("id")
        .values_list("key", "seq", "command", "event_type", "data", "reservation")
    )


def task_row(instance_id: str) -> tuple[Any, ...]:
    """The task's columns, its input decoded (PostgreSQL's jsonb orders an instance's
    input keys its own way, which the workflow path then encodes)."""
    [row] = ActivityTask.objects.filter(instance_id=instance_id).values_list(*TASK_COLUMNS)
    index = TASK_COLUMNS.index("input")
    return (*row[:index], json.loads(row[index]), *row[index + 1 :])


def test_enqueue_records_the_activity_and_its_success_closes_the_instance() -> None:
    result = tasks.add.enqueue(2, 3)
    # Before any worker: the instance waits for its activity, which is queued.
    instance = WorkflowInstance.objects.get(instance_id=result.id)
    assert (instance.status, instance.runnable, instance.lease_epoch) == ("running", False, 0)
    assert instance.current_step == "activity selvedge.task.run"
    [(key, seq, command, event, data, reservation)] = history(result.id)
    assert (key, seq, command, event, data) == (TASK_KEY, 1, "activity", "Reserved", None)
    assert json.loads(reservation) == {"name": "selvedge.task.run", "queue": "default"}
    assert task_row(result.id)[-3:] == ("queued", 0, 0)

    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker())
    finally:
        injector.uninstall()
    operations = [s.operation for s in injector.statements if s.instance_id == result.id]
    assert "complete_closing" in operations, operations
    assert not EXECUTION_WRITES & set(operations), operations
    assert WorkflowInstance.objects.get(instance_id=result.id).lease_epoch == 0

    done = tasks.add.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (Status.SUCCESSFUL, 5, 1)
    assert [(row[0], row[3], row[4]) for row in history(result.id)] == [
        (TASK_KEY, "ActivityCompleted", "5"),
        ("$close", CLOSE_EVENT_BY_STATUS["completed"], "5"),
    ]
    assert sv.get_workflow_result(result.id).output == 5
    sv.replay_instance(result.id)  # the recorded history is the workflow's own
    assert tasks.calls == [("add", (2, 3))]


def test_the_start_records_what_the_workflows_first_execution_would() -> None:
    """The same task through the plain workflow start (which an execution carries to its
    activity) and through enqueue: the same history, task row and result."""
    enqueued = tasks.send_email.using(priority=7).enqueue("ann@example.com", subject="hi")
    input_value = WorkflowInstance.objects.get(instance_id=enqueued.id).input
    started = sv.start_workflow(TASK_WORKFLOW, input_value, priority=7)
    run_until_idle(Worker())
    assert history(started) == history(enqueued.id)
    assert task_row(started) == task_row(enqueued.id)
    plain, direct = sv.get_workflow_result(started), sv.get_workflow_result(enqueued.id)
    assert (
        (plain.status, plain.output)
        == (direct.status, direct.output)
        == (
            "completed",
            {"to": "ann@example.com", "subject": "hi"},
        )
    )
    for instance_id in (started, enqueued.id):
        sv.replay_instance(instance_id)
    # Only the plain start was leased, to issue the activity.
    epochs = dict(
        WorkflowInstance.objects.filter(instance_id__in=[started, enqueued.id]).values_list(
            "instance_id", "lease_epoch"
        )
    )
    assert epochs[enqueued.id] == 0 and epochs[started] >= 1


class _Abandoned(Exception):
    pass


def test_an_enqueue_in_a_transaction_commits_and_rolls_back_with_it() -> None:
    """Inside a caller's transaction (a view under ``ATOMIC_REQUESTS``) an enqueue
    writes with it: nothing of a rolled-back one stays, committed ones run. On
    PostgreSQL it is one statement in a savepoint of its own."""
    with pytest.raises(_Abandoned), transaction.atomic():
        rolled_back = tasks.add.enqueue(1, 1)
        raise _Abandoned
    assert not WorkflowInstance.objects.filter(instance_id=rolled_back.id).exists()
    assert not ActivityTask.objects.filter(instance_id=rolled_back.id).exists()

    statements: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(spy):
            first = tasks.add.enqueue(2, 3)
        second = tasks.add.enqueue(4, 5)
    if connection.vendor == "postgresql":
        verbs = [statement.split(None, 1)[0].upper() for statement in statements]
        assert verbs == ["SAVEPOINT", "WITH", "RELEASE"], statements
    run_until_idle(Worker())
    assert [tasks.add.get_result(r.id).return_value for r in (first, second)] == [5, 9]
    assert [row[3] for row in history(first.id)] == [row[3] for row in history(second.id)]


def test_an_enqueue_failing_in_a_transaction_leaves_the_transaction_usable() -> None:
    """A database error of the enqueue's own statements (a lock timeout behind another
    transaction's table lock) rolls back only the enqueue: the caller goes on and
    commits its other writes."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no lock timeout: its writers queue for the database")
    ready, release = threading.Event(), threading.Event()
    table = connection.ops.quote_name(WorkflowInstance._meta.db_table)

    def hold_the_instance_table() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
                ready.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_instance_table)
    holder.start()
    try:
        assert ready.wait(10)
        before = WorkflowInstance.objects.count()
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '200ms'")
            with pytest.raises(OperationalError, match="lock timeout"):
                tasks.add.enqueue(1, 2)
            Ledger.objects.create(entry="after the failed enqueue")
    finally:
        release.set()
        holder.join(10)
    assert Ledger.objects.filter(entry="after the failed enqueue").count() == 1
    assert WorkflowInstance.objects.count() == before


def test_a_task_that_fails_for_good_closes_through_the_replay() -> None:
    result = tasks.once.enqueue("no luck")
    run_until_idle(Worker())
    done = tasks.once.get_result(result.id)
    assert (done.status, done.attempts) == (Status.FAILED, 1)
    assert sv.get_workflow_result(result.id).status == "failed"
    assert WorkflowInstance.objects.get(instance_id=result.id).lease_epoch >= 1
    sv.replay_instance(result.id)


def test_a_retried_task_is_closed_by_the_attempt_that_succeeds() -> None:
    result = tasks.flaky.enqueue(2)
    worker = Worker()
    run_until_idle(worker)
    # The retry waits for its backoff on the database clock; run until it has passed.
    wait_until(
        lambda: run_until_idle(worker) >= 0 and tasks.flaky.get_result(result.id).is_finished
    )
    done = tasks.flaky.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (Status.SUCCESSFUL, 2, 2)
    assert WorkflowInstance.objects.get(instance_id=result.id).lease_epoch == 0
    sv.replay_instance(result.id)


def test_an_instance_a_cancel_request_reached_is_left_to_its_replay() -> None:
    """The attempt succeeds after a cancel request: its value is recorded, the instance is
    not closed by the completion (the request is the workflow's to observe) but woken,
    and the replay closes it; nothing runs twice."""
    result = tasks.noted.enqueue("raced")
    store = sv_store()
    [claimed] = store.tasks.claim_tasks("racer", 1, ["selvedge.task.run"])
    sv.cancel_workflow(result.id, reason="operator")
    assert store.sole_activity.complete_closing(claimed.claim, '"raced"') is False
    instance = WorkflowInstance.objects.get(instance_id=result.id)
    assert (instance.status, instance.runnable) == ("running", True)
    run_until_idle(Worker())
    closed = sv.get_workflow_result(result.id)
    # The workflow returns the recorded value (its execute() had already been issued).
    assert (closed.status, closed.output) == ("completed", "raced")
    sv.replay_instance(result.id)
    assert tasks.calls == []  # the attempt above was the store's own, not a run


def test_a_lost_claim_closes_nothing() -> None:
    result = tasks.noted.enqueue("late")
    store = sv_store()
    [claimed] = store.tasks.claim_tasks("late-worker", 1, ["selvedge.task.run"])
    ActivityTask.objects.filter(instance_id=result.id).update(claim_epoch=99)
    assert store.sole_activity.complete_closing(claimed.claim, '"late"') is None
    instance = WorkflowInstance.objects.get(instance_id=result.id)
    assert instance.status == "running"
    assert [row[3] for row in history(result.id)] == ["Reserved"]


def sv_store() -> Any:
    from selvedge_django.operations.base import client_store

    return client_store()
