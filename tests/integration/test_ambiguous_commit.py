"""Ambiguous commits: the COMMIT succeeds, but the caller sees a lost connection.

``FaultInjector.fail_after_commit`` lets a statement's transaction commit and
then raises ``InjectedFault`` (an ``OperationalError``), as a connection lost
before the answer to the COMMIT arrived would. Each durable write must leave the
caller somewhere sane: the write happened exactly once, a retry either fails
cleanly (a start: ``WorkflowAlreadyStarted``) or changes nothing (an activity's
completion), and nothing is left stuck.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import OperationalError, transaction

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, SignalMessage, WorkflowInstance
from selvedge_django.testing import FaultInjector, InjectedFault, run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.models import Ledger

QUIET = {"run_local_starts": False}


@pytest.fixture
def faults(tdb: None) -> Iterator[FaultInjector]:
    with FaultInjector() as injector:
        yield injector


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def test_a_start_whose_commit_was_lost_is_there_and_a_retry_says_so(
    faults: FaultInjector,
) -> None:
    fault = faults.fail_after_commit(operation="create_instance")
    with pytest.raises(InjectedFault) as caught:
        sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="lost-start")
    assert isinstance(caught.value, OperationalError)
    assert fault.fired == 1
    # The start committed: a retry with the same id is told so, and nothing is doubled.
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="lost-start")
    assert WorkflowInstance.objects.filter(instance_id="lost-start").count() == 1
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result("lost-start").output == 6


def test_a_start_handed_to_a_local_worker_runs_once_its_lease_expires(
    faults: FaultInjector, worker: Worker
) -> None:
    # The start leased the instance to this process's worker, but the commit's answer
    # never came: the hand-over is not made, and nobody runs it until the lease lapses.
    fault = faults.fail_after_commit(operation="create_instance")
    with pytest.raises(InjectedFault):
        sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="lost-local")
    assert fault.fired == 1
    assert instance("lost-local").lease_owner == worker.worker_id
    result = sv.wait_workflow("lost-local", timeout=30)
    assert (result.status, result.output) == ("completed", 6)


def test_a_start_inside_a_transaction_commits_with_it_and_the_caller_sees_the_loss(
    faults: FaultInjector,
) -> None:
    faults.fail_after_commit(operation="create_instance")
    with pytest.raises(InjectedFault), transaction.atomic():
        Ledger.objects.create(entry="with-the-start")
        sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="lost-tx")
    assert Ledger.objects.filter(entry="with-the-start").exists()
    assert WorkflowInstance.objects.filter(instance_id="lost-tx").exists()


def test_a_completion_whose_commit_was_lost_is_recorded_once_and_not_charged(
    faults: FaultInjector,
) -> None:
    iid = sv.start_workflow("test.ledger", ["lost-1", "lost-2"])
    # An inline result commits with the execution's next write: the second step's with
    # the close, whose commit the caller does not see.
    fault = faults.fail_after_commit(operation="close", instance_id=iid)
    run_until_idle(Worker(**QUIET))
    assert fault.fired == 1
    # The result is recorded once, nothing ran again, and the run is closed.
    assert sv.get_workflow_result(iid).output == ["lost-1", "lost-2"]
    assert sorted(Ledger.objects.values_list("entry", flat=True)) == ["lost-1", "lost-2"]
    tasks = ActivityTask.objects.filter(instance_id=iid).order_by("seq")
    assert [(t.status, t.attempts, t.failures) for t in tasks] == [("completed", 1, 0)] * 2
    assert instance(iid).execution_errors == 0


def test_a_background_completion_whose_commit_was_lost_is_recorded_once_and_not_charged(
    faults: FaultInjector,
) -> None:
    iid = sv.start_workflow("test.ledger", ["bg-1", "bg-2"])
    # A worker that runs no activities reserves the first step as a queued task; another
    # claims it in the background and completes it (complete_task), commit unseen.
    run_until_idle(Worker(**QUIET, activity_queues=[]))
    fault = faults.fail_after_commit(operation="complete_task", instance_id=iid)
    run_until_idle(Worker(**QUIET))
    assert fault.fired == 1
    # The attempt tried again, found its result recorded, and the workflow went on.
    assert sv.get_workflow_result(iid).output == ["bg-1", "bg-2"]
    assert sorted(Ledger.objects.values_list("entry", flat=True)) == ["bg-1", "bg-2"]
    tasks = ActivityTask.objects.filter(instance_id=iid).order_by("seq")
    assert [(t.status, t.attempts, t.failures) for t in tasks] == [("completed", 1, 0)] * 2


def test_a_close_whose_commit_was_lost_stays_closed_once(faults: FaultInjector) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    fault = faults.fail_after_commit(operation="close", instance_id=iid)
    run_until_idle(Worker(**QUIET))
    assert fault.fired == 1
    inst = instance(iid)
    assert (inst.status, inst.lease_owner, inst.execution_errors) == ("completed", "", 0)
    assert sv.get_workflow_result(iid).output == 6
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    # Nothing is left to run, held back or retried.
    assert run_until_idle(Worker(**QUIET)) == 0


def test_a_signal_whose_commit_was_lost_arrives_once(faults: FaultInjector) -> None:
    iid = sv.start_workflow("wait.receive", {"channels": ["go"]})
    run_until_idle(Worker(**QUIET))
    fault = faults.fail_after_commit(operation="append_signal")
    with pytest.raises(InjectedFault):
        sv.signal(iid, "go", {"n": 1})
    assert fault.fired == 1
    # Signals have no idempotency key: this one is there once (sending it again would
    # add a second), and the workflow receives it.
    assert SignalMessage.objects.filter(instance_id=iid).count() == 1
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(iid).output == [{"n": 1}]


def test_fail_after_commit_can_wait_for_a_statement_that_changed_rows(
    faults: FaultInjector,
) -> None:
    # min_rows: only a statement that did something (a poll that found work) strikes.
    fault = faults.fail_after_commit(operation="lease_batch", pattern="UPDATE", min_rows=1)
    worker = Worker(**QUIET)
    assert worker.dispatcher.run_once() == 0 and fault.fired == 0
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    with pytest.raises(InjectedFault):
        worker.dispatcher.run_once()
    assert fault.fired == 1
    # The lease committed: the instance waits for it to lapse, then runs.
    assert instance(iid).lease_owner == worker.worker_id
    with pytest.raises(ValueError, match="min_rows"):
        faults.fail_statement(operation="close", min_rows=1)
