"""start_workflow(..., execution_timeout=...): the leader terminates overdue runs.

SPEC section 11: a run still open after its execution timeout (database clock) is
terminated as ``terminate_workflow`` does, with the reason ``"execution
timeout"``: a new lease epoch (a worker still holding the old one is fenced), its
unfinished tasks cancelled (a late result is discarded), its timers deleted and
its running children asked to cancel, in one transaction. The deadline is a
column written only when a timeout is given; the leader's sweep reads it through
a partial index, one bounded batch a round. The tests move the database clock
with a ControllableClock instead of waiting.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import selvedge_django as sv
from selvedge_django.engine.events import HistoryRow
from selvedge_django.models import ActivityTask, HistoryEvent, TimerSubscription, WorkflowInstance
from selvedge_django.operations import client_store
from selvedge_django.testing import (
    ControllableClock,
    FaultInjector,
    InjectedFault,
    run_until_idle,
)
from selvedge_django.worker import Worker

# The "manual" queue of terminate.everything's activity is never served here.
QUIET: dict[str, Any] = {"activity_queues": [""], "run_local_starts": False}


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def sweep(worker: Worker | None = None) -> list[str]:
    """One round of the leader's execution timeout sweep; the ids it terminated."""
    worker = worker or Worker(**QUIET)
    return [
        run.instance_id for run in worker.store.execution_timeouts.sweep_execution_timeouts(100)
    ]


def close_row(instance_id: str) -> HistoryEvent:
    return HistoryEvent.objects.get(instance_id=instance_id, key="$close")


def test_a_run_past_its_timeout_is_terminated_with_everything_it_owns(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("terminate.everything", None, execution_timeout=timedelta(seconds=5))
    run_until_idle(Worker(**QUIET))
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=iid)
    store = client_store()
    # An attempt of its activity is running when the deadline passes.
    (claimed,) = store.tasks.claim_tasks("attempt-worker", 1, ["wait.manual"])
    before = instance(iid)
    description = sv.describe(iid)
    assert description.execution_timeout == timedelta(seconds=5)
    assert description.execution_deadline is not None
    assert before.execution_deadline_ms is not None

    selvedge_clock.advance(4)
    assert sweep() == []  # not yet overdue
    assert instance(iid).status == "running"
    selvedge_clock.advance(2)
    assert sweep() == [iid]

    inst = instance(iid)
    assert (inst.status, inst.lease_owner, inst.runnable) == ("failed", "", False)
    assert inst.lease_epoch == before.lease_epoch + 1
    result = sv.get_workflow_result(iid)
    assert isinstance(result.error, sv.WorkflowTerminated)
    assert (result.error.instance_id, result.error.reason) == (iid, "execution timeout")
    assert ActivityTask.objects.get(instance_id=iid).status == "cancelled"
    assert not TimerSubscription.objects.filter(instance_id=iid).exists()
    assert instance(child.instance_id).cancel_requested
    closed_by = json.loads(close_row(iid).reservation or "")["closed_by"]
    assert closed_by == {
        "execution_timeout": {"timeout_ms": 5000, "deadline_ms": before.execution_deadline_ms}
    }
    # The attempt that was running finishes late: its result is discarded.
    activity_row = HistoryEvent.objects.get(instance_id=iid, command="activity")
    assert not store.tasks.complete_task(claimed.claim, json.dumps("late"))
    assert HistoryEvent.objects.get(id=activity_row.id).data is None
    assert ActivityTask.objects.get(instance_id=iid).status == "cancelled"
    # Nothing more happens on later rounds; the run still replays.
    assert sweep() == []
    run_until_idle(Worker(**QUIET))
    assert instance(child.instance_id).status == "cancelled"
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    sv.replay_instance(iid)


def test_a_run_that_finishes_first_is_untouched(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, execution_timeout=60)
    run_until_idle(Worker(**QUIET))
    done = instance(iid)
    assert done.status == "completed"
    selvedge_clock.advance(120)
    assert sweep() == []
    run_until_idle(Worker(**QUIET))
    after = instance(iid)
    assert (after.status, after.output, after.lease_epoch, after.updated_at) == (
        "completed",
        done.output,
        done.lease_epoch,
        done.updated_at,
    )
    assert sv.get_workflow_result(iid).output == 6


def test_a_sleeping_run_is_terminated_and_its_timer_deleted(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=30)
    run_until_idle(Worker(**QUIET))
    assert TimerSubscription.objects.filter(instance_id=iid).exists()
    # run_until_idle does the leader's duties too: advancing past the deadline is enough.
    selvedge_clock.advance(31)
    run_until_idle(Worker(**QUIET))
    inst = instance(iid)
    assert inst.status == "failed"
    assert not TimerSubscription.objects.filter(instance_id=iid).exists()
    error = sv.get_workflow_result(iid).error
    assert isinstance(error, sv.WorkflowTerminated)
    assert error.reason == "execution timeout"
    # The timer's due time passing later changes nothing.
    selvedge_clock.advance(3600)
    run_until_idle(Worker(**QUIET))
    assert instance(iid).status == "failed"


def test_a_run_without_a_timeout_has_no_deadline_and_is_never_swept(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("wait.sleep", {"seconds": 3600})
    run_until_idle(Worker(**QUIET))
    inst = instance(iid)
    assert (inst.execution_timeout_ms, inst.execution_deadline_ms) == (None, None)
    description = sv.describe(iid)
    assert (description.execution_timeout, description.execution_deadline) == (None, None)
    assert description.to_json()["execution_timeout"] is None
    selvedge_clock.advance(100 * 86400)
    assert sweep() == []


def test_the_sweep_is_bounded_and_takes_the_most_overdue_first(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    ids = [
        sv.start_workflow(
            "wait.sleep", {"seconds": 3600}, instance_id=f"t-{n:02}", execution_timeout=10 + n
        )
        for n in range(25)
    ]
    selvedge_clock.advance(60)
    worker = Worker(max_workflows_per_batch=10, **QUIET)
    assert worker.leader.sweep_execution_timeouts(10) == 10
    # The first round took the ten whose deadline passed first.
    failed = WorkflowInstance.objects.filter(status="failed").values_list("instance_id", flat=True)
    assert set(failed) == set(ids[:10])
    assert worker.leader.sweep_execution_timeouts(10) == 10
    assert worker.leader.sweep_execution_timeouts(10) == 5
    assert worker.leader.sweep_execution_timeouts(10) == 0
    assert set(WorkflowInstance.objects.values_list("status", flat=True)) == {"failed"}
    assert HistoryEvent.objects.filter(key="$close").count() == 25


def test_the_leader_sweeps_one_batch_a_tick(tdb: None, selvedge_clock: ControllableClock) -> None:
    for _ in range(7):
        sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=5)
    selvedge_clock.advance(6)
    worker = Worker(max_workflows_per_batch=3, **QUIET)
    leader = worker.leader
    counts = [leader.run_once() for _ in range(4)]
    assert leader.is_leader
    assert counts == [3, 3, 1, 0]
    assert WorkflowInstance.objects.filter(status="running").count() == 0
    leader.resign()


def test_a_worker_holding_the_old_epoch_cannot_write_after_the_timeout(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=5)
    store = client_store()
    fence = store.instances.acquire(iid, "stale-worker", 3600)
    assert fence is not None
    selvedge_clock.advance(6)
    assert sweep() == [iid]
    with pytest.raises(sv.Fenced):
        store.record_command(fence, HistoryRow(key="x", seq=0, command="now", data="1"))
    assert list(HistoryEvent.objects.filter(instance_id=iid).values_list("key", flat=True)) == [
        "$close"
    ]


def test_a_child_started_with_an_execution_timeout_is_terminated_and_its_parent_told(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    parent = sv.start_workflow("terminate.timed_parent", 20)
    run_until_idle(Worker(**QUIET))
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=parent)
    assert child.execution_timeout_ms == 20_000
    assert instance(parent).execution_deadline_ms is None
    selvedge_clock.advance(21)
    run_until_idle(Worker(**QUIET))
    assert instance(child.instance_id).status == "failed"
    assert sv.get_workflow_result(parent).output == {
        "error": "WorkflowTerminated",
        "reason": "execution timeout",
        "id": child.instance_id,
    }


def test_a_bad_child_timeout_fails_the_parent_with_the_start_error(tdb: None) -> None:
    parent = sv.start_workflow("terminate.timed_parent", -1)
    run_until_idle(Worker(**QUIET))
    assert instance(parent).status == "failed"
    error = sv.get_workflow_result(parent).error
    assert getattr(error, "type", None) == "selvedge_django.exceptions.WorkflowStartRejected"
    assert str(error) == "child execution_timeout must be positive, not -1"
    assert not WorkflowInstance.objects.filter(parent_instance_id=parent).exists()


@pytest.mark.parametrize(
    "bad",
    [0, -5, timedelta(0), float("nan"), float("inf"), "60", True, [60], 10**12, 2**80],
    ids=repr,
)
def test_bad_timeouts_raise_the_start_error_and_write_nothing(tdb: None, bad: Any) -> None:
    with pytest.raises(sv.WorkflowStartRejected, match="execution_timeout"):
        sv.start_workflow("wait.sleep", {"seconds": 1}, instance_id="bad", execution_timeout=bad)
    assert not WorkflowInstance.objects.exists()
    # The same id starts fine afterwards: nothing was reserved.
    sv.start_workflow("wait.sleep", {"seconds": 1}, instance_id="bad", execution_timeout=0.5)
    assert instance("bad").execution_timeout_ms == 500


def test_astart_workflow_takes_the_timeout(tdb: None) -> None:
    async def view() -> str:
        try:
            return await sv.astart_workflow(
                "wait.sleep", {"seconds": 1}, execution_timeout=timedelta(minutes=2)
            )
        finally:
            await sync_to_async(connections.close_all)()

    iid = asyncio.run(view())
    assert instance(iid).execution_timeout_ms == 120_000


def test_a_resumed_run_gets_its_timeout_again_from_the_resume_and_a_fork_inherits_it(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=30)
    run_until_idle(Worker(**QUIET))
    selvedge_clock.advance(31)
    assert sweep() == [iid]
    store = client_store()
    resumed_at = store.now_ms()
    sv.resume_workflow(iid, reason="slow dependency fixed")
    inst = instance(iid)
    assert inst.status == "running"
    # A full timeout again, counted from the resume: not terminated at once.
    assert inst.execution_timeout_ms == 30_000
    assert resumed_at + 30_000 <= (inst.execution_deadline_ms or 0) <= store.now_ms() + 30_000
    assert sweep() == []
    forked = sv.fork_workflow(iid)
    fork = instance(forked)
    assert fork.execution_timeout_ms == 30_000
    assert fork.execution_deadline_ms is not None
    assert fork.execution_deadline_ms >= resumed_at + 30_000
    selvedge_clock.advance(31)
    assert sorted(sweep()) == sorted([iid, forked])
    assert instance(iid).generation == 2


def test_the_cli_start_takes_the_timeout(tdb: None) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    call_command(
        "runselvedge", "start", "wait.sleep", '{"seconds": 1}', "--id", "cli-1",
        "--execution-timeout", "90s", stdout=out,
    )  # fmt: skip
    assert instance("cli-1").execution_timeout_ms == 90_000
    with pytest.raises(CommandError):
        call_command("runselvedge", "start", "wait.sleep", "--execution-timeout", "soon")


# -- crash points ------------------------------------------------------------------------


def everything_state(instance_id: str) -> dict[str, Any]:
    """What a sweep may change: the instance, its history, tasks, timers and children."""
    inst = WorkflowInstance.objects.filter(instance_id=instance_id).values().get()
    return {
        "instance": inst,
        "history": list(HistoryEvent.objects.filter(instance_id=instance_id).values()),
        "tasks": list(ActivityTask.objects.filter(instance_id=instance_id).values()),
        "timers": list(TimerSubscription.objects.filter(instance_id=instance_id).values()),
        "children": list(
            WorkflowInstance.objects.filter(parent_instance_id=instance_id).values(
                "instance_id", "status", "cancel_requested", "runnable"
            )
        ),
    }


def test_a_failing_statement_at_each_step_of_the_sweep_leaves_the_run_as_it_was(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("terminate.everything", None, execution_timeout=5)
    run_until_idle(Worker(**QUIET))
    selvedge_clock.advance(6)
    before = everything_state(iid)
    store = client_store()
    injector = FaultInjector(trace=True).install()
    try:
        # Fail the close row's insert, after counting the statements before it.
        injector.fail_statement(r"INSERT INTO .*history", operation="sweep_execution_timeouts")
        assert store.execution_timeouts.sweep_execution_timeouts(10) == []
        steps = max(
            s.step for s in injector.statements if s.operation == "sweep_execution_timeouts"
        )
    finally:
        injector.uninstall()
    assert steps >= 8
    assert everything_state(iid) == before
    for step in range(1, steps + 1):
        injector = FaultInjector().install()
        try:
            fault = injector.fail_statement(None, operation="sweep_execution_timeouts", step=step)
            try:
                assert store.execution_timeouts.sweep_execution_timeouts(10) == []
            except InjectedFault:
                assert step == 1  # the batch's read: the whole round fails, and is retried
            assert fault.fired == 1
        finally:
            injector.uninstall()
        assert everything_state(iid) == before, f"step {step} left a partial write"
    # The next round terminates it, once.
    assert sweep() == [iid]
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    assert ActivityTask.objects.get(instance_id=iid).status == "cancelled"


def test_an_ambiguous_commit_of_the_sweep_is_not_terminated_twice(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("terminate.everything", None, execution_timeout=5)
    run_until_idle(Worker(**QUIET))
    selvedge_clock.advance(6)
    store = client_store()
    injector = FaultInjector().install()
    try:
        fault = injector.fail_after_commit(
            r"INSERT INTO .*history", operation="sweep_execution_timeouts"
        )
        store.execution_timeouts.sweep_execution_timeouts(10)
        assert fault.fired == 1
    finally:
        injector.uninstall()
    # Committed: the run is closed once, and the next rounds leave it alone.
    inst = instance(iid)
    assert inst.status == "failed"
    assert sweep() == []
    assert sweep() == []
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    error = sv.get_workflow_result(iid).error
    assert isinstance(error, sv.WorkflowTerminated)
    assert error.reason == "execution timeout"


def test_the_close_is_guarded_by_the_deadline_having_passed(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    """A sweep that read a run as overdue, when the run closed and was resumed (a new
    deadline) before its close, leaves it alone: the close checks the deadline again."""
    iid = sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=5)
    run_until_idle(Worker(**QUIET))
    store = client_store()
    before = everything_state(iid)
    envelope = json.dumps({"type": "WorkflowTerminated", "message": "x", "kind": "engine"})
    with pytest.raises(sv.InvalidWorkflowState):
        store.instances.terminate(iid, envelope, {"execution_timeout": {}}, overdue=True)
    assert everything_state(iid) == before
    selvedge_clock.advance(6)
    store.instances.terminate(iid, envelope, {"execution_timeout": {}}, overdue=True)
    assert instance(iid).status == "failed"
