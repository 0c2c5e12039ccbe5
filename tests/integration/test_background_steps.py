"""Background steps: what an activity run by another worker costs besides its own writes.

A background step is the reservation (which also releases the lease), the activity
worker's claim, its completion and the lease that resumes the workflow. These tests
check that nothing else is read on the way: the activity poller does not read the
next due time after every claim, and the lease brings the value the parked execution
waits for, so an execution the workflow cache kept goes on without reading it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import EV_ACTIVITY_COMPLETED
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.storage import store_for
from selvedge_django.testing import FaultInjector
from selvedge_django.worker import Worker
from tests.conftest import wait_until

pytestmark = pytest.mark.usefixtures("tdb")


def start_step(tag: str) -> str:
    """``act.run`` of one ``act.step`` (tests/testapp/workflows/activities.py)."""
    return sv.start_workflow("act.run", {"activity": "act.step", "input": {"tag": tag}})


def reserve_elsewhere(instance_id: str) -> Any:
    """Run the workflow on a worker that serves no activity queue: it reserves the task
    (releasing its lease in the same write); return the instance row."""
    worker = Worker(activity_queues=[])
    worker.resumptions.inline = True
    assert worker.dispatcher.run_once() == 1
    return WorkflowInstance.objects.get(instance_id=instance_id)


def test_the_lease_brings_the_value_that_arrived_where_the_execution_waits() -> None:
    instance_id = start_step("parked")
    inst = reserve_elsewhere(instance_id)
    (task,) = ActivityTask.objects.filter(instance_id=instance_id)
    # The reservation recorded where the execution waits: at get() of that activity.
    assert (inst.lease_owner, inst.parked_seq, inst.parked_key) == ("", task.seq, task.key)

    store = store_for("default", Codec())
    (claimed,) = store.tasks.claim_tasks("activity-worker", 10, ["act.step"])
    assert store.tasks.complete_task(claimed.claim, json.dumps("done"))

    ((_, head),) = store.instances.lease_batch("workflow-worker", 30, 10, ["act.run"])
    assert head.parked_key == task.key
    assert head.parked_value == (EV_ACTIVITY_COMPLETED, json.dumps("done"))


def test_a_lease_before_any_value_arrived_brings_none() -> None:
    instance_id = start_step("nothing-yet")
    reserve_elsewhere(instance_id)
    WorkflowInstance.objects.filter(instance_id=instance_id).update(runnable=True)
    store = store_for("default", Codec())
    ((_, head),) = store.instances.lease_batch("workflow-worker", 30, 10, ["act.run"])
    assert head.parked_value is None


def test_the_first_execution_of_an_instance_reads_no_snapshot() -> None:
    started = start_step("first")  # started here, dispatched by a worker: never ran
    injector = FaultInjector(trace=True).install()
    try:
        inst = reserve_elsewhere(started)
    finally:
        injector.uninstall()
    assert inst.parked_seq > 0  # it ran to its activity's reservation
    operations = [s.operation for s in injector.statements]
    assert "lease_batch" in operations and "load_snapshot" not in operations, operations

    # Dispatched again, it has history: the snapshot is read.
    WorkflowInstance.objects.filter(instance_id=started).update(runnable=True)
    store = store_for("default", Codec())
    ((_, head),) = store.instances.lease_batch("workflow-worker", 30, 10, ["act.run"])
    assert not head.history_empty
    snapshot = store.instances.load_snapshot(started, head)
    assert [row.key for row in snapshot.history] == [inst.parked_key]


def test_a_kept_execution_goes_on_without_reading_its_activitys_value() -> None:
    injector = FaultInjector(trace=True).install()
    worker = Worker(activity_queues=[]).start()
    try:
        instance_id = start_step("kept")
        wait_until(lambda: ActivityTask.objects.filter(instance_id=instance_id).exists())
        wait_until(lambda: worker.workflow_cache_stats()["entries"] == 1)
        store = store_for("default", Codec())
        (claimed,) = store.tasks.claim_tasks("activity-worker", 10, ["act.step"])
        assert store.tasks.complete_task(claimed.claim, json.dumps("from elsewhere"))
        result = sv.wait_workflow(instance_id, timeout=20)
        stats = worker.workflow_cache_stats()
    finally:
        worker.stop()
        injector.uninstall()
    assert (result.status, result.output) == ("completed", "from elsewhere")
    assert stats["hits"] == 1  # continued, not replayed
    operations = [s.operation for s in injector.statements]
    assert "lease_batch" in operations
    assert "get_row" not in operations and "load_snapshot" not in operations


def test_the_poller_reads_the_next_due_time_only_after_a_round_that_claimed_nothing() -> None:
    worker = Worker()
    worker.activities.inline = True
    poller = worker.activity_poller
    assert poller.run_once() == 0
    assert poller.next_delay(1.0) == 1.0  # read: nothing queued
    reserve_elsewhere(start_step("due-time"))  # wakes the poller
    assert poller.run_once() == 1  # claimed, ran and completed the step
    with CaptureQueriesContext(connection) as after_work:
        poller.next_delay(1.0)
    assert after_work.captured_queries == []

    assert poller.run_once() == 0
    with CaptureQueriesContext(connection) as after_nothing:
        assert poller.next_delay(1.0) == 1.0  # nothing queued
    # One read of the next due task (the paused queues it leaves out may be read again
    # too, once the process's copy of them is older than the poll interval).
    due_reads = [q for q in after_nothing.captured_queries if "activitytask" in q["sql"]]
    assert len(due_reads) == 1, after_nothing.captured_queries
    with CaptureQueriesContext(connection) as again:
        poller.next_delay(1.0)  # still known: nothing changed
    assert again.captured_queries == []


def test_a_task_queued_not_yet_due_sets_the_next_poll() -> None:
    instance_id = start_step("later")
    reserve_elsewhere(instance_id)
    store = store_for("default", Codec())
    (claimed,) = store.tasks.claim_tasks("activity-worker", 10, ["act.step"])
    assert store.tasks.retry_task(claimed.claim, json.dumps({"message": "again"}), 30.0)

    worker = Worker()
    poller = worker.activity_poller
    assert poller.run_once() == 0  # woken by the retry: not due yet
    assert 29.0 < poller.next_delay(60.0) <= 30.01
