"""terminate_workflow: close a running instance at once, without running its code.

SPEC section 11: the instance fails with ``WorkflowTerminated(instance_id,
reason)``; in one transaction the lease epoch moves on (a worker still running
it is fenced), unfinished tasks are cancelled, timers deleted and running
children asked to cancel. Closed instances raise ``InstanceClosed``, unknown
ones ``WorkflowNotFound``. The close row is the one history row it writes, so a
later resume has only that row to archive.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.operations import client_store
from selvedge_django.testing import FaultInjector, InjectedFault, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger

# The "manual" queue of terminate.everything's activity is never served here.
QUIET = {"activity_queues": [""], "run_local_starts": False}


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def rows(instance_id: str) -> list[tuple[str, str, str | None, str | None]]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("id")
        .values_list("key", "event_type", "data", "reservation")
    )


def parked() -> tuple[str, str]:
    """A terminate.everything instance parked at its receive, and its child."""
    iid = sv.start_workflow("terminate.everything", None)
    run_until_idle(Worker(**QUIET))
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=iid)
    assert instance(iid).status == "running"
    assert TimerSubscription.objects.filter(instance_id=iid).exists()
    assert ActivityTask.objects.get(instance_id=iid).status == "queued"
    return iid, child.instance_id


def test_terminate_closes_a_running_instance_with_everything_it_owns(tdb: None) -> None:
    iid, child = parked()
    before = instance(iid)
    recorded = rows(iid)
    sv.terminate_workflow(iid, reason="stuck")
    inst = instance(iid)
    assert (inst.status, inst.lease_owner, inst.runnable) == ("failed", "", False)
    assert inst.lease_epoch == before.lease_epoch + 1
    assert inst.closed_at is not None
    result = sv.get_workflow_result(iid)
    assert isinstance(result.error, sv.WorkflowTerminated)
    assert (result.error.instance_id, result.error.reason) == (iid, "stuck")
    assert str(result.error) == f"workflow {iid!r} terminated: stuck"
    # Tasks cancelled, timers gone, the child asked to cancel.
    assert ActivityTask.objects.get(instance_id=iid).status == "cancelled"
    assert not TimerSubscription.objects.filter(instance_id=iid).exists()
    assert instance(child).cancel_requested
    # One row more: the close, which says who closed the run; the rows that still
    # waited for a value are left as they were (a resume archives the close alone).
    after = rows(iid)
    assert after[:-1] == recorded
    key, event_type, data, reservation = after[-1]
    assert (key, event_type) == ("$close", "WorkflowFailed")
    assert json.loads(data or "")["type"] == "WorkflowTerminated"
    assert json.loads(reservation or "") == {"closed_by": {"terminate": {"reason": "stuck"}}}
    # The child runs its cancellation; nothing of the parent runs again.
    run_until_idle(Worker(**QUIET))
    assert instance(child).status == "cancelled"
    assert rows(iid) == after
    # A terminated run still replays: its commands match, wherever it stopped.
    sv.replay_instance(iid)


def test_terminate_refuses_closed_and_unknown_instances(tdb: None) -> None:
    iid, _ = parked()
    sv.terminate_workflow(iid)
    with pytest.raises(sv.WorkflowAlreadyFailed):
        sv.terminate_workflow(iid)
    done = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    run_until_idle(Worker(**QUIET))
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.terminate_workflow(done)
    with pytest.raises(sv.WorkflowNotFound):
        sv.terminate_workflow("no-such-instance")
    with pytest.raises(sv.WorkflowNotFound):
        sv.terminate_workflow("")
    with pytest.raises(TypeError):
        sv.terminate_workflow(done, reason=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sv.terminate_workflow(done, reason="nul \x00 inside")


def test_terminate_inside_a_rolled_back_transaction_changes_nothing(tdb: None) -> None:
    iid, _ = parked()
    with pytest.raises(RuntimeError), transaction.atomic():
        sv.terminate_workflow(iid, "never mind")
        raise RuntimeError("roll back")
    assert instance(iid).status == "running"
    assert TimerSubscription.objects.filter(instance_id=iid).exists()


def test_a_terminated_child_fails_its_waiting_parent(tdb: None) -> None:
    parent = sv.start_workflow("terminate.parent", None)
    run_until_idle(Worker(**QUIET))
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=parent)
    sv.terminate_workflow(child.instance_id, "child stuck")
    run_until_idle(Worker(**QUIET))
    result = sv.get_workflow_result(parent)
    assert result.output == {
        "error": "WorkflowTerminated",
        "reason": "child stuck",
        "id": child.instance_id,
    }


def test_aterminate_workflow_is_the_async_twin(tdb: None) -> None:
    iid, _ = parked()

    async def view() -> None:
        try:
            await sv.aterminate_workflow(iid, "from a view")
        finally:
            await sync_to_async(connections.close_all)()

    asyncio.run(view())
    error = sv.get_workflow_result(iid).error
    assert isinstance(error, sv.WorkflowTerminated) and error.reason == "from a view"


def test_terminate_fires_the_failed_hook_after_commit(tdb: None) -> None:
    from django.conf import settings
    from django.test import override_settings

    from selvedge_django.hooks import WorkflowHooks

    seen: list[Any] = []

    class Hooks(WorkflowHooks):
        def on_workflow_failed(self, event: Any) -> None:
            seen.append(event)

    iid, _ = parked()
    with (
        override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": Hooks()}),
        transaction.atomic(),
    ):
        sv.terminate_workflow(iid, "r")
        assert seen == []
    (event,) = seen
    assert (event.instance_id, event.workflow_name) == (iid, "terminate.everything")
    assert isinstance(event.error, sv.WorkflowTerminated)


def test_terminate_fences_a_worker_still_running_the_instance(
    worker: Worker, tmp_path: Path
) -> None:
    marker = tmp_path / "hold"
    marker.touch()
    iid = sv.start_workflow("test.hold_then_record", {"entry": "t1", "hold_while": str(marker)})
    wait_until(lambda: Ledger.objects.filter(entry="started:t1").exists())
    held = instance(iid)
    assert held.lease_owner == worker.worker_id
    sv.terminate_workflow(iid, "hung")
    recorded = rows(iid)
    assert instance(iid).lease_epoch == held.lease_epoch + 1
    # The attempt lost its claim: heartbeat() raises, and the execution writes nothing.
    wait_until(lambda: not worker.runtime.attempts.active_attempts())
    marker.unlink()
    assert worker.resumptions.wait_idle(20)
    assert rows(iid) == recorded
    assert not Ledger.objects.filter(entry__in=["done:t1", "after:t1"]).exists()
    task = ActivityTask.objects.get(instance_id=iid, name="test.hold")
    assert (task.status, task.claim_owner) == ("cancelled", "")
    assert sv.get_workflow_result(iid).status == "failed"


def everything(instance_id: str, child: str) -> dict[str, Any]:
    """What a terminate may change, to compare before and after a failed one."""

    def inst(iid: str) -> dict[str, Any]:
        values = WorkflowInstance.objects.filter(instance_id=iid).values().get()
        values.pop("updated_at")
        return values

    return {
        "instance": inst(instance_id),
        "child": inst(child),
        "history": rows(instance_id),
        "tasks": list(ActivityTask.objects.filter(instance_id=instance_id).values()),
        "timers": list(TimerSubscription.objects.filter(instance_id=instance_id).values()),
    }


def terminate_statements() -> int:
    """How many statements a terminate runs, counted on a second parked instance."""
    other, _ = parked()
    injector = FaultInjector(trace=True).install()
    try:
        sv.terminate_workflow(other, "counting")
        return max(
            s.step for s in injector.statements if s.operation == "terminate" and not s.waiter_hint
        )
    finally:
        injector.uninstall()


def test_a_failing_statement_at_each_step_of_a_terminate_leaves_everything_as_it_was(
    tdb: None,
) -> None:
    iid, child = parked()
    before = everything(iid, child)
    steps = terminate_statements()
    assert steps >= 4
    for step in range(1, steps + 1):
        injector = FaultInjector().install()
        try:
            fault = injector.fail_statement(None, operation="terminate", step=step)
            with pytest.raises(InjectedFault):
                sv.terminate_workflow(iid, "stuck")
            assert fault.fired == 1
        finally:
            injector.uninstall()
        assert everything(iid, child) == before, f"step {step} left a partial write"
    sv.terminate_workflow(iid, "stuck")
    assert instance(iid).status == "failed"
    assert instance(child).cancel_requested


def test_an_ambiguous_commit_of_a_terminate_is_seen_by_the_next_call(tdb: None) -> None:
    iid, child = parked()
    epoch = instance(iid).lease_epoch
    last = terminate_statements()
    injector = FaultInjector().install()
    try:
        # Every statement of the terminate commits; the caller hears of a lost connection.
        injector.fail_after_commit(None, operation="terminate", step=last)
        with pytest.raises(InjectedFault):
            sv.terminate_workflow(iid, "stuck")
    finally:
        injector.uninstall()
    # Committed once: the retry is told the run is closed, and nothing is written twice.
    closed = rows(iid)
    with pytest.raises(sv.WorkflowAlreadyFailed):
        sv.terminate_workflow(iid, "stuck")
    assert rows(iid) == closed
    assert [key for key, *_ in closed].count("$close") == 1
    assert instance(iid).lease_epoch == epoch + 1
    assert instance(child).cancel_requested


def test_a_resume_racing_a_late_activity_result_and_a_signal_loses_neither(tdb: None) -> None:
    """An attempt still running when its run is terminated and resumed reports too late:
    its result is refused and the re-run's own task is untouched; a signal sent while
    the run was closed is refused to its sender (never silently dropped), and one sent
    after the resume is delivered."""
    store = client_store()
    iid, _ = parked()
    (stale,) = store.tasks.claim_tasks("stale-worker", 1, ["wait.manual"])
    assert stale.claim.instance_id == iid
    sv.terminate_workflow(iid, "hung")
    with pytest.raises(sv.InstanceClosed):
        sv.signal(iid, "never", "while closed")
    sv.resume_workflow(iid)
    run_until_idle(Worker(**QUIET))
    # The first generation's task went to the archive with its row; the re-run has its own.
    (summary,) = ArchivedHistoryEvent.objects.filter(
        instance_id=iid, key__endswith="wait.manual"
    ).values_list("task", flat=True)
    assert json.loads(summary or "")["status"] == "cancelled"
    (task,) = ActivityTask.objects.filter(instance_id=iid, name="wait.manual")
    assert (task.status, task.attempts) == ("queued", 0)
    assert task.id != stale.claim.task_id
    # The late result of the first generation's attempt: refused, nothing recorded.
    recorded = rows(iid)
    assert not store.tasks.complete_task(stale.claim, json.dumps("late"))
    assert rows(iid) == recorded
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("queued", 0)
    # The re-run's attempt is the one that counts; the signal after the resume arrives.
    (fresh,) = store.tasks.claim_tasks("fresh-worker", 1, ["wait.manual"])
    assert fresh.claim.task_id == task.id
    assert store.tasks.complete_task(fresh.claim, json.dumps("fresh"))
    sv.signal(iid, "never", "after the resume")
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(iid).output == "after the resume"
    values = [data for key, _, data, _ in rows(iid) if key.endswith("wait.manual")]
    assert values == [json.dumps("fresh")]
    sv.replay_instance(iid)
