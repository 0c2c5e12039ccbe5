"""Cancellation on real databases: durable requests, scopes, detached cleanup and closing.

Every test runs real worker threads against SQLite or PostgreSQL
(``SELVEDGE_TEST_DB``), or drives the ORM store directly. The worker serves the
default queue only, so tasks issued on ``cancel.unserved`` stay queued. Waits
poll the database with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import Fence, HistoryRow
from selvedge_django.engine.ports import ChildSpec, CloseRequest, TaskSpec
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.storage import store_for
from tests.conftest import wait_until
from tests.testapp.models import Ledger

# Short leases and claims, so a cancelled task's attempt learns it within a fraction of a second.
FAST_LEASE = {"TTL": 3, "RENEW_INTERVAL": 0.2, "MARGIN": 0.5, "MAX_SKEW": 0.1}


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
def cworker(make_worker: Callable[..., Any]) -> Any:
    """A started worker that serves only the default queue, with fast claim renewal."""
    return make_worker(activity_queues=[""], lease=FAST_LEASE)


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def parked(instance_id: str, after_epoch: int = 0) -> bool:
    """The instance ran (past ``after_epoch``), suspended and waits for input."""
    return WorkflowInstance.objects.filter(
        instance_id=instance_id,
        status="running",
        lease_owner="",
        runnable=False,
        lease_epoch__gt=after_epoch,
    ).exists()


def rows(instance_id: str, command: str | None = None) -> list[HistoryEvent]:
    qs = HistoryEvent.objects.filter(instance_id=instance_id)
    if command is not None:
        qs = qs.filter(command=command)
    return list(qs.order_by("id"))


def row(instance_id: str, key: str) -> HistoryEvent:
    return HistoryEvent.objects.get(instance_id=instance_id, key=key)


def error_type(event: HistoryEvent) -> str:
    assert event.data is not None
    return str(json.loads(event.data)["type"])


def task(instance_id: str, key: str) -> ActivityTask:
    return ActivityTask.objects.get(instance_id=instance_id, key=key)


def in_ledger(entry: str) -> bool:
    return Ledger.objects.filter(entry=entry).exists()


def no_attempts(worker: Any) -> bool:
    return not worker.runtime.attempts.active_attempts()


def timers(instance_id: str) -> list[str]:
    return sorted(
        TimerSubscription.objects.filter(instance_id=instance_id).values_list("key", flat=True)
    )


# -- 1. durable cancellation at every blocking wait -------------------------------------

WAITS = {
    # kind: (command of the wait's history row, event recorded on cancellation)
    "sleep": ("sleep", "TimerCancelled"),
    "receive": ("receive", "SignalCancelled"),
    "receive_with_timeout": ("receive", "SignalCancelled"),
    "wait_condition": ("await", "AwaitCancelled"),
    "timer_get": ("sleep", "TimerCancelled"),
    "future_get": ("activity", "ActivityCancelled"),
    "child_get": ("child", "ChildCancelled"),
}


@pytest.mark.parametrize("kind", list(WAITS))
def test_a_cancel_request_wakes_a_blocked_wait_and_closes_the_instance_as_cancelled(
    cworker: Any, kind: str
) -> None:
    iid = sv.start_workflow("cancel.wait", {"kind": kind})
    wait_until(lambda: parked(iid))
    child_id = f"{iid}/#1:child:child.waiter"
    if kind == "child_get":
        wait_until(lambda: parked(child_id))
    before = sv.describe(iid)
    assert (before.cancel_requested, before.cancel_reason) == (False, "")

    sv.cancel_workflow(iid, "customer asked")
    described = sv.describe(iid)
    assert (described.cancel_requested, described.cancel_reason) == (True, "customer asked")

    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "cancelled"
    assert type(result.error) is sv.WorkflowCancelled
    assert (result.error.instance_id, result.error.reason) == (iid, "customer asked")
    command, event = WAITS[kind]
    (wait_row,) = rows(iid, command)
    assert wait_row.event_type == event
    assert error_type(wait_row) == "WorkflowCancelled"
    assert [r.event_type for r in rows(iid, "close")] == ["WorkflowCancelled"]
    assert timers(iid) == []
    after = sv.describe(iid)
    assert (after.status, after.cancel_requested, after.cancel_reason) == (
        "cancelled",
        True,
        "customer asked",
    )
    if kind == "future_get":
        # Future.get cancelled its unfinished (queued) task when it saw the request.
        assert task(iid, wait_row.key).status == "cancelled"
    if kind == "child_get":
        child = sv.describe(child_id)
        assert child.cancel_requested and iid in child.cancel_reason
        assert sv.wait_workflow(child_id, timeout=20).status == "cancelled"
        wait_row.refresh_from_db()
        assert (wait_row.event_type, error_type(wait_row)) == (
            "ChildCancelled",
            "WorkflowCancelled",
        )


def test_stored_outcomes_win_and_reads_ignore_the_request_until_a_new_wait(cworker: Any) -> None:
    iid = sv.start_workflow("cancel.reads")
    wait_until(
        lambda: parked(iid) and ActivityTask.objects.get(instance_id=iid).status == "completed"
    )
    sv.signal(iid, "work", 41)
    sv.cancel_workflow(iid, "stop please")
    sv.signal(iid, "go")

    result = sv.wait_workflow(iid, timeout=20)
    # The workflow caught the cancellation and returned: it completes normally.
    assert result.status == "completed", result.error
    out = result.output
    assert out["ready"] is True and out["value"] == 5  # a stored outcome wins
    # At a new receive, cancellation wins over the pending signal ...
    assert out["receive"] == ["WorkflowCancelled", iid, "stop please"]
    assert out["receive_with_timeout"] == "WorkflowCancelled"  # before the pending signal
    assert out["zero_timeout"] == "ReceiveTimeout"  # a nonpositive timeout still times out
    # ... which pending(), now() and receive_async() still see, ignoring the request.
    assert out["pending"] == 1
    assert isinstance(out["now"], str)
    assert out["receive_async"] == [41, True]
    assert out["pending_after"] == 0
    assert out["sleep"] == "WorkflowCancelled"  # `except Exception` does not catch it
    receives = [(r.event_type, json.loads(r.data or "null")) for r in rows(iid, "receive")]
    assert receives[0] == ("SignalReceived", None)  # the detached gate
    assert [event for event, _ in receives[1:4]] == [
        "SignalCancelled",
        "SignalCancelled",
        "SignalTimeout",
    ]
    assert receives[4] == ("SignalReceived", 41)
    assert rows(iid, "await") == []  # the predicate held at once: no command
    assert timers(iid) == []
    assert not SignalMessage.objects.filter(instance_id=iid, consumed_seq__isnull=True).exists()
    assert sv.describe(iid).cancel_requested is True


def test_a_request_alone_leaves_a_running_task_until_future_get_cancels_it(cworker: Any) -> None:
    iid = sv.start_workflow("cancel.future", {"entry": "fut"})
    wait_until(lambda: in_ledger("started:fut") and parked(iid))
    (activity,) = rows(iid, "activity")
    epoch = instance(iid).lease_epoch

    sv.cancel_workflow(iid, "stop")
    # The request woke the instance; it replayed and parked again at its detached gate.
    wait_until(lambda: parked(iid, after_epoch=epoch))
    assert task(iid, activity.key).status == "running"
    assert row(iid, activity.key).data is None
    assert not in_ledger("heartbeat-raised:fut")

    sv.signal(iid, "go")
    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled) and result.error.reason == "stop"
    assert task(iid, activity.key).status == "cancelled"
    cancelled = row(iid, activity.key)
    assert (cancelled.event_type, error_type(cancelled)) == (
        "ActivityCancelled",
        "WorkflowCancelled",
    )

    # The running attempt lost its claim: heartbeat() raised, and its late result is ignored.
    wait_until(lambda: in_ledger("heartbeat-raised:fut"))
    wait_until(lambda: no_attempts(cworker))
    late = row(iid, activity.key)
    assert (late.event_type, late.data) == (cancelled.event_type, cancelled.data)
    assert task(iid, activity.key).status == "cancelled"


def test_a_detached_cleanup_activity_runs_after_the_request_and_the_instance_closes_cancelled(
    cworker: Any,
) -> None:
    iid = sv.start_workflow("cancel.cleanup")
    wait_until(lambda: parked(iid))
    sv.cancel_workflow(iid, "shop closed")

    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert result.error.reason == "shop closed"
    assert in_ledger(f"cleanup:{iid}")
    assert [(r.command, r.event_type) for r in rows(iid)] == [
        ("receive", "SignalCancelled"),
        ("activity", "ActivityCompleted"),
        ("close", "WorkflowCancelled"),
    ]
    assert [t.status for t in sv.list_activity_tasks(iid)] == ["completed"]


def test_a_detached_scope_ignores_the_request_and_cancels_only_by_its_own_function(
    cworker: Any,
) -> None:
    iid = sv.start_workflow("cancel.detached_scope")
    wait_until(lambda: parked(iid))
    sv.signal(iid, "work", "w1")
    sv.signal(iid, "work", "w2")
    sv.cancel_workflow(iid, "go away")
    sv.signal(iid, "go")

    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == ["w1", "ScopeCancelled", "WorkflowCancelled"]
    pending = SignalMessage.objects.filter(instance_id=iid, consumed_seq__isnull=True)
    assert [json.loads(s.payload) for s in pending] == ["w2"]
    assert len(rows(iid, "cancel_scope")) == 1


# -- 2. scopes --------------------------------------------------------------------------


def test_cancelling_a_scope_writes_one_record_and_cancels_its_tasks_timers_and_children(
    cworker: Any,
) -> None:
    iid = sv.start_workflow("cancel.scope", {"entry": "scoped"})
    wait_until(lambda: in_ledger("started:scoped") and parked(iid))
    running, queued = rows(iid, "activity")
    timer, detached_timer = rows(iid, "sleep")
    (child_row,) = rows(iid, "child")
    child_id = json.loads(child_row.reservation or "{}")["child_id"]
    assert child_id == f"{iid}/{child_row.key}"
    wait_until(lambda: parked(child_id))
    assert task(iid, queued.key).status == "queued"
    assert timers(iid) == sorted([timer.key, detached_timer.key])

    sv.signal(iid, "go")
    # The scope is cancelled; the workflow parks at its "finish" gate.
    wait_until(
        lambda: (
            parked(iid)
            and HistoryEvent.objects.filter(
                instance_id=iid, command="receive", event_type="SignalCancelled"
            ).exists()
        )
    )
    (record,) = rows(iid, "cancel_scope")
    targets = json.loads(record.reservation or "{}")["targets"]
    assert sorted(targets, key=lambda t: t["key"]) == [
        {"key": running.key, "command": "activity"},
        {"key": queued.key, "command": "activity"},
        {"key": timer.key, "command": "sleep"},
        {"key": child_row.key, "command": "child", "child_id": child_id},
    ]
    # One fenced transaction cancelled the running and the queued task, deleted the
    # scope's timer subscription and requested the child's cancellation.
    assert task(iid, running.key).status == "cancelled"
    assert task(iid, queued.key).status == "cancelled"
    assert timers(iid) == [detached_timer.key]
    for target in (running, queued, timer, child_row):
        target.refresh_from_db()
        assert error_type(target) == "ScopeCancelled"
        assert target.delivered_seq == record.seq
    assert (timer.event_type, child_row.event_type) == ("TimerCancelled", "ChildCancelled")
    described_child = sv.describe(child_id)
    assert described_child.cancel_requested is True
    assert sv.wait_workflow(child_id, timeout=20).status == "cancelled"
    child_row.refresh_from_db()
    assert error_type(child_row) == "ScopeCancelled"  # the child's close did not overwrite it

    # Commands issued in the cancelled scope recorded cancellation and created nothing.
    late_activity, late_child, late_sleep = (
        rows(iid, "activity")[2],
        rows(iid, "child")[1],
        rows(iid, "sleep")[2],
    )
    assert late_activity.event_type == "ActivityCancelled"
    assert ActivityTask.objects.filter(instance_id=iid).count() == 2
    assert late_child.event_type == "ChildCancelled"
    late_child_id = json.loads(late_child.reservation or "{}")["child_id"]
    assert not WorkflowInstance.objects.filter(instance_id=late_child_id).exists()
    assert late_sleep.event_type == "TimerCancelled"
    assert rows(iid, "receive")[1].event_type == "SignalCancelled"
    assert timers(iid) == [detached_timer.key]

    # The running attempt lost its claim: heartbeat() raised; its late result is ignored.
    wait_until(lambda: in_ledger("heartbeat-raised:scoped"))
    wait_until(lambda: no_attempts(cworker))
    running.refresh_from_db()
    assert (running.event_type, error_type(running)) == ("ActivityCancelled", "ScopeCancelled")
    assert task(iid, running.key).status == "cancelled"

    sv.signal(iid, "finish")
    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == {
        "running": "ScopeCancelled",
        "queued": "ScopeCancelled",
        "timer": "ScopeCancelled",
        "child": "ScopeCancelled",
        "late_child_id": late_child_id,
        "late_activity": "ScopeCancelled",
        "late_child": "ScopeCancelled",
        "late_sleep": "ScopeCancelled",
        "late_receive": "ScopeCancelled",
    }
    # Repeated cancel calls, replays and the call after the gate wrote nothing more.
    assert len(rows(iid, "cancel_scope")) == 1
    assert timers(iid) == []
    detached_timer.refresh_from_db()
    assert detached_timer.event_type == "TimerCancelled"  # closure cancelled it
    sv.replay_instance(iid)


def test_an_uncaught_scope_cancellation_without_a_request_closes_the_instance_as_failed(
    cworker: Any,
) -> None:
    iid = sv.start_workflow("cancel.scope_uncaught")
    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "failed"
    assert type(result.error) is sv.ScopeCancelled
    assert isinstance(result.error, sv.Cancelled) and not isinstance(result.error, Exception)
    assert issubclass(sv.WorkflowCancelled, sv.Cancelled)
    assert issubclass(sv.Cancelled, BaseException) and not issubclass(sv.Cancelled, Exception)
    assert not issubclass(sv.ScopeCancelled, sv.WorkflowCancelled)
    assert [(r.command, r.event_type) for r in rows(iid)] == [
        ("cancel_scope", "ScopeCancelled"),
        ("sleep", "TimerCancelled"),
        ("close", "WorkflowFailed"),
    ]
    (record,) = rows(iid, "cancel_scope")
    assert json.loads(record.reservation or "{}") == {"targets": []}  # even for an empty scope
    assert sv.describe(iid).cancel_requested is False


def test_replay_rejects_a_change_in_which_commands_a_scope_cancels(cworker: Any) -> None:
    iid = sv.start_workflow("cancel.scope_choice", {"inside": [True, True]})
    assert sv.wait_workflow(iid, timeout=20).status == "completed"
    (record,) = rows(iid, "cancel_scope")
    assert len(json.loads(record.reservation or "{}")["targets"]) == 2
    history = sv.export_history(iid)
    sv.replay_history(history)  # the same code and input replay cleanly

    changed = json.loads(history.to_json())
    changed["instance"]["input"] = {"inside": [True, False]}  # same commands, fewer cancelled
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(sv.parse_history(json.dumps(changed)))
    assert isinstance(caught.value.divergence, sv.NondeterminismError)
    assert "cancel_scope" in str(caught.value.divergence)


@pytest.mark.parametrize("mode", ["thread", "predicate"])
def test_a_cancel_function_called_off_the_workflow_thread_or_in_a_predicate_fails_the_run(
    cworker: Any, mode: str
) -> None:
    iid = sv.start_workflow("cancel.misuse", {"mode": mode})
    result = sv.wait_workflow(iid, timeout=20)
    assert result.status == "failed"
    assert isinstance(result.error, sv.NondeterminismError)
    assert rows(iid, "cancel_scope") == []


def test_a_cancel_call_while_suspending_writes_nothing(cworker: Any) -> None:
    iid = sv.start_workflow("cancel.in_finally")
    wait_until(lambda: parked(iid))
    epoch = instance(iid).lease_epoch
    sv.signal(iid, "other")  # another run, suspending at the same receive
    wait_until(lambda: parked(iid, after_epoch=epoch))
    assert rows(iid) == []

    sv.signal(iid, "go")
    assert sv.wait_workflow(iid, timeout=20).status == "completed"
    assert [(r.seq, r.command) for r in rows(iid)] == [
        (1, "receive"),
        (2, "cancel_scope"),
        (None, "close"),
    ]


# -- 3. closing -------------------------------------------------------------------------


def test_returning_with_unfinished_work_cancels_every_task_timer_and_child_at_close(
    cworker: Any,
) -> None:
    iid = sv.start_workflow("cancel.unawaited", {"entry": "unawaited"})
    wait_until(lambda: in_ledger("started:unawaited") and parked(iid))
    running, queued = rows(iid, "activity")
    (child_row,) = rows(iid, "child")
    child_id = f"{iid}/{child_row.key}"
    wait_until(lambda: parked(child_id))
    assert task(iid, queued.key).status == "queued"

    sv.signal(iid, "go")
    result = sv.wait_workflow(iid, timeout=20)
    assert (result.status, result.output) == ("completed", "returned")
    # The close cancelled the running task and the detached queued one, and the timer.
    assert task(iid, running.key).status == "cancelled"
    assert task(iid, queued.key).status == "cancelled"
    for target in (running, queued):
        target.refresh_from_db()
        assert target.event_type == "ActivityCancelled"
    assert [r.event_type for r in rows(iid, "sleep")] == ["TimerCancelled"]
    assert timers(iid) == []
    # ... and requested the running child's cancellation.
    child = sv.describe(child_id)
    assert child.cancel_requested and iid in child.cancel_reason
    assert sv.wait_workflow(child_id, timeout=20).status == "cancelled"

    # The running attempt lost renewal, saw heartbeat() raise, and its result is ignored.
    wait_until(lambda: in_ledger("heartbeat-raised:unawaited"))
    wait_until(lambda: no_attempts(cworker))
    running.refresh_from_db()
    assert running.event_type == "ActivityCancelled"
    assert task(iid, running.key).status == "cancelled"
    parent = instance(iid)
    assert (parent.status, parent.runnable) == ("completed", False)  # never reopened


def _spec() -> TaskSpec:
    return TaskSpec(
        name="test.add",
        workflow_name="cancel.store_only",
        input=json.dumps({"a": 1, "b": 1}),
        queue="",
        options={},
        max_attempts=5,
        schedule_to_start_timeout=None,
        start_to_close_timeout=None,
        heartbeat_timeout=None,
    )


@pytest.mark.parametrize("requested", [False, True])
def test_close_cancels_tasks_timers_and_children_in_its_own_fenced_transaction(
    tdb: None, requested: bool
) -> None:
    store = store_for("default", Codec())
    store.options.lease_ttl = 30.0
    iid = sv.start_workflow("cancel.store_only")
    fence = store.instances.acquire(iid, "owner-a", ttl=60)
    assert fence is not None
    store.reserve_activity(fence, HistoryRow("#1:test.add", 1, "activity"), _spec(), None)
    store.reserve_activity(fence, HistoryRow("#2:test.add", 2, "activity"), _spec(), None)
    (attempt,) = store.tasks.claim_tasks("activity-worker", 1, ["test.add"])
    assert attempt.claim.key == "#1:test.add"
    expires = timezone.now() + timedelta(hours=1)
    store.reserve_timer(fence, HistoryRow("#3:sleep", 3, "sleep"), expires, 3600)
    child_id = f"{iid}/#4:child"
    store.start_child(
        fence,
        HistoryRow("#4:child", 4, "child", reservation=json.dumps({"child_id": child_id})),
        ChildSpec(child_id, "cancel.store_only", None),
    )
    if requested:
        sv.cancel_workflow(iid, "requested")
    error = json.dumps({"kind": "engine", "type": "ScopeCancelled", "message": "x"})

    # A stale holder's close changes nothing at all.
    with pytest.raises(sv.Fenced):
        store.close(Fence(iid, "owner-a", fence.epoch - 1), CloseRequest("cancelled", None, error))
    assert sorted(
        ActivityTask.objects.filter(instance_id=iid).values_list("status", flat=True)
    ) == [
        "queued",
        "running",
    ]
    assert timers(iid) == ["#3:sleep"]
    assert sv.describe(child_id).cancel_requested is False
    assert instance(iid).status == "running"

    status = store.close(fence, CloseRequest("cancelled", None, error))
    # A cancellation closes as cancelled only when a durable request exists.
    assert status == ("cancelled" if requested else "failed")
    assert instance(iid).status == status
    assert set(ActivityTask.objects.filter(instance_id=iid).values_list("status", flat=True)) == {
        "cancelled"
    }
    assert [(r.key, r.event_type) for r in rows(iid) if r.command != "child"] == [
        ("#1:test.add", "ActivityCancelled"),
        ("#2:test.add", "ActivityCancelled"),
        ("#3:sleep", "TimerCancelled"),
        ("$close", "WorkflowCancelled" if requested else "WorkflowFailed"),
    ]
    assert timers(iid) == []
    child = sv.describe(child_id)
    assert child.cancel_requested and iid in child.cancel_reason

    # The running attempt cannot renew, complete or fail any more.
    claim = attempt.claim
    assert store.tasks.renew_task(claim, 30) is False
    assert store.tasks.complete_task(claim, "2") is False
    assert store.tasks.fail_task(claim, json.dumps({"message": "late"})) is False
    assert row(iid, "#1:test.add").event_type == "ActivityCancelled"


# -- 5. client calls: describe and bad input --------------------------------------------


def test_cancel_workflow_rejects_closed_instances_and_unknown_ids(cworker: Any) -> None:
    completed = sv.start_workflow("cancel.scope_choice", {"inside": []})
    failed = sv.start_workflow("cancel.scope_uncaught")
    cancelled = sv.start_workflow("cancel.cleanup")
    wait_until(lambda: parked(cancelled))
    sv.cancel_workflow(cancelled, "first reason")
    for iid, status in ((completed, "completed"), (failed, "failed"), (cancelled, "cancelled")):
        assert sv.wait_workflow(iid, timeout=20).status == status

    with pytest.raises(sv.WorkflowAlreadyCompleted) as done:
        sv.cancel_workflow(completed, "too late")
    assert isinstance(done.value, sv.InstanceClosed)
    assert (done.value.instance_id, done.value.status) == (completed, "completed")
    with pytest.raises(sv.WorkflowAlreadyFailed) as broken:
        sv.cancel_workflow(failed)
    assert isinstance(broken.value, sv.InstanceClosed) and broken.value.status == "failed"
    sv.cancel_workflow(cancelled, "again")  # already cancelled: succeeds
    with pytest.raises(sv.WorkflowNotFound):
        sv.cancel_workflow("cancel-no-such-instance")

    for iid in (completed, failed):
        described = sv.describe(iid)
        assert (described.cancel_requested, described.cancel_reason) == (False, "")
    described = sv.describe(cancelled)
    assert (described.status, described.cancel_requested) == ("cancelled", True)
    assert described.cancel_reason == "first reason"


# -- 7. execute() observes the request like execute_async().get() --------------------------


@sv.activity(name="cancel.inline.record")
def inline_record(entry: str) -> str:
    Ledger.objects.create(entry=entry)
    return entry


@sv.activity(name="cancel.inline.cancel_me")
def cancel_me(instance_id: str) -> str:
    """Request the cancellation of the calling instance while it holds its lease."""
    sv.cancel_workflow(instance_id, "asked from inside")
    return "asked"


@sv.workflow(name="cancel.inline.execute")
def execute_after_request(ctx: sv.WorkflowContext, how: str) -> Any:
    """Run ``cancel.inline.record`` one way or another after a cancel request exists."""
    if how == "during":
        cancel_me.execute(ctx, ctx.instance_id)  # the request commits under this lease
    if how == "detached":
        return inline_record.execute(ctx.detached(), f"{how}:{ctx.instance_id}")
    if how == "async":
        return inline_record.execute_async(ctx, f"{how}:{ctx.instance_id}").get(ctx)
    return inline_record.execute(ctx, f"{how}:{ctx.instance_id}")


@pytest.fixture
def stepper(tdb: None) -> Any:
    from selvedge_django.worker import Worker

    return Worker(activity_queues=[""])


@pytest.mark.parametrize("how", ["before", "during", "async"])
def test_execute_observes_a_durable_request_before_running_inline(stepper: Any, how: str) -> None:
    from selvedge_django.testing import run_until_idle

    iid = sv.start_workflow(execute_after_request, how, instance_id=f"inline-{how}")
    if how != "during":
        sv.cancel_workflow(iid, "asked before it ran")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "cancelled", (result.output, result.error)
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert not in_ledger(f"{how}:{iid}")  # the activity never ran
    (recorded,) = [r for r in rows(iid, "activity") if "record" in r.key]
    assert (recorded.event_type, error_type(recorded)) == ("ActivityCancelled", "WorkflowCancelled")
    assert task(iid, recorded.key).status == "cancelled"
    assert task(iid, recorded.key).attempts == 0
    sv.replay_instance(iid)


def test_execute_in_a_detached_scope_runs_after_a_request(stepper: Any) -> None:
    from selvedge_django.testing import run_until_idle

    iid = sv.start_workflow(execute_after_request, "detached", instance_id="inline-detached")
    sv.cancel_workflow(iid, "asked before it ran")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    # A detached scope ignores the request; the run then returns, so it completes.
    assert result.status == "completed", result.error
    assert in_ledger(f"detached:{iid}")
