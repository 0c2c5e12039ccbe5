"""Pausing instances and activity queues (SPEC section 20), on real databases.

A paused instance stays running; no execution of it is dispatched, no task of it
claimed and no timer of it fired until the unpause, while signals, cancel requests
and the outcome of an attempt already running are recorded and take effect after
it. Terminate and the execution timeout still close it. A paused queue keeps its
tasks queued for worker claims and inline claims alike.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django.models import (
    PAUSED_OWNER,
    ActivityQueue,
    ActivityTask,
    HistoryEvent,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.operations import client_store
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.workflows import pauses


def drive(**overrides: Any) -> int:
    """Run a fresh, unstarted Worker (a new process, in effect) until nothing is runnable."""
    return run_until_idle(Worker(**overrides))


def inst(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def gates() -> Any:
    """The gates of pauses' workflows and activities, opened and cleared after the test."""
    pauses.AT_GATE.clear()
    yield pauses.GATE
    for gate in pauses.GATE.values():
        gate.set()
    pauses.GATE.clear()
    pauses.AT_GATE.clear()


# -- instances: the state and its errors ---------------------------------------------------


def test_a_paused_instance_stays_running_and_says_why(tdb: None) -> None:
    iid = sv.start_workflow("pause.receive", None)
    drive()
    sv.pause_workflow(iid, reason="the payment provider is down")
    description = sv.describe(iid)
    assert (description.status, description.paused) == ("running", True)
    assert description.paused_reason == "the payment provider is down"
    assert description.paused_at is not None
    assert description.to_json()["paused"] is True
    sv.unpause_workflow(iid)
    description = sv.describe(iid)
    assert (description.paused, description.paused_reason, description.paused_at) == (
        False,
        "",
        None,
    )


def test_pausing_a_paused_or_closed_instance_is_refused_and_writes_nothing(tdb: None) -> None:
    iid = sv.start_workflow("pause.receive", None)
    drive()
    sv.pause_workflow(iid, reason="first")
    before = inst(iid)
    with pytest.raises(sv.InvalidWorkflowState, match="paused already"):
        sv.pause_workflow(iid, reason="second")
    after = inst(iid)
    assert (after.lease_epoch, after.paused_reason) == (before.lease_epoch, "first")
    sv.unpause_workflow(iid)
    with pytest.raises(sv.InvalidWorkflowState, match="not paused"):
        sv.unpause_workflow(iid)
    done = sv.start_workflow("pause.other", 1)
    drive()
    assert sv.get_workflow_result(done).status == "completed"
    with pytest.raises(sv.InvalidWorkflowState, match="completed"):
        sv.pause_workflow(done)
    with pytest.raises(sv.InvalidWorkflowState, match="completed"):
        sv.unpause_workflow(done)
    with pytest.raises(sv.WorkflowNotFound):
        sv.pause_workflow("no-such-instance")
    with pytest.raises(TypeError):
        sv.pause_workflow(iid, reason=3)  # type: ignore[arg-type]
    assert not inst(iid).paused_reason


def test_a_paused_instance_is_not_dispatched_and_its_signal_waits_for_the_unpause(
    tdb: None,
) -> None:
    iid = sv.start_workflow("pause.receive", None)
    drive()
    sv.pause_workflow(iid)
    sv.signal(iid, "go", "value")
    row = inst(iid)
    assert (row.runnable, row.lease_owner) == (True, PAUSED_OWNER)
    # Nothing picks it up: no worker round does anything for it, however many run.
    assert drive() == 0
    assert drive() == 0
    assert sv.describe(iid).status == "running"
    sv.unpause_workflow(iid)
    drive()
    result = sv.get_workflow_result(iid)
    assert (result.status, result.output) == ("completed", "value")


def test_a_cancel_request_is_accepted_while_paused_and_takes_effect_after(tdb: None) -> None:
    iid = sv.start_workflow("pause.receive", None)
    drive()
    sv.pause_workflow(iid)
    sv.cancel_workflow(iid, reason="not needed")
    assert drive() == 0
    description = sv.describe(iid)
    assert (description.status, description.cancel_requested) == ("running", True)
    sv.unpause_workflow(iid)
    drive()
    assert sv.get_workflow_result(iid).status == "cancelled"


def test_terminate_closes_a_paused_instance(tdb: None) -> None:
    iid = sv.start_workflow("pause.activity", "x")
    drive(activity_queues=["other"])
    sv.pause_workflow(iid)
    sv.terminate_workflow(iid, reason="given up")
    result = sv.get_workflow_result(iid)
    assert isinstance(result.error, sv.WorkflowTerminated)
    assert ActivityTask.objects.get(instance_id=iid).status == "cancelled"
    description = sv.describe(iid)
    assert (description.status, description.paused) == ("failed", False)
    with pytest.raises(sv.InvalidWorkflowState):
        sv.unpause_workflow(iid)


def test_the_execution_timeout_still_applies_to_a_paused_instance(
    clock: ControllableClock,
) -> None:
    iid = sv.start_workflow("pause.receive", None, execution_timeout=30)
    drive(clock=clock)
    sv.pause_workflow(iid)
    clock.advance(timedelta(seconds=31))
    drive(clock=clock)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.WorkflowTerminated)


# -- instances: tasks, timers and running executions ---------------------------------------


def test_no_task_of_a_paused_instance_is_claimed_until_the_unpause(tdb: None) -> None:
    paused = sv.start_workflow("pause.activity", "held")
    witness = sv.start_workflow("pause.activity", "free")
    drive(activity_queues=["other"])  # both reserve their task on "pq", none runs
    sv.pause_workflow(paused)
    task = ActivityTask.objects.get(instance_id=paused)
    assert (task.status, task.held) == ("queued", True)
    drive()
    assert sv.get_workflow_result(witness).output == "free"
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("queued", 0)
    # No inline claim either.
    store = client_store()
    assert store.claim_task(paused, task.key, "inline-worker") is None
    sv.unpause_workflow(paused)
    assert not ActivityTask.objects.get(instance_id=paused).held
    drive()
    assert sv.get_workflow_result(paused).output == "held"


def test_timers_due_while_paused_fire_after_the_unpause_in_order(
    clock: ControllableClock,
) -> None:
    iid = sv.start_workflow("pause.timers", None)
    drive(clock=clock)
    assert TimerSubscription.objects.filter(instance_id=iid).count() == 3
    sv.pause_workflow(iid)
    clock.advance(timedelta(seconds=60))
    drive(clock=clock, max_timers_per_batch=1)
    # All three are due and none fired: no history value, the timers still armed.
    assert TimerSubscription.objects.filter(instance_id=iid, held=True).count() == 3
    assert not HistoryEvent.objects.filter(instance_id=iid, command="sleep").exclude(data=None)
    assert client_store().waits.next_timer_due_ms() is None  # the poller has nothing to wait for
    sv.unpause_workflow(iid)
    drive(clock=clock, max_timers_per_batch=1)
    assert sv.get_workflow_result(iid).status == "completed"
    fired = list(
        HistoryEvent.objects.filter(instance_id=iid, command="sleep")
        .order_by("arrived_at", "id")
        .values_list("key", flat=True)
    )
    assert fired == ["t10", "t20", "t30"]


def test_an_attempt_running_when_paused_records_its_outcome_and_waits(
    make_worker: Any, gates: dict[str, threading.Event]
) -> None:
    gates["running"] = threading.Event()
    iid = sv.start_workflow("pause.held", "running")
    make_worker()
    assert pauses.AT_GATE.wait(20)
    sv.pause_workflow(iid)
    task = ActivityTask.objects.get(instance_id=iid)
    assert (task.status, task.held) == ("running", True)
    gates["running"].set()
    # The attempt's outcome is recorded although the instance is paused...
    wait_until(lambda: ActivityTask.objects.get(instance_id=iid).status == "completed")
    row = HistoryEvent.objects.get(instance_id=iid, key=task.key)
    assert row.data is not None
    # ...and nothing runs the instance: it has not reached its receive.
    assert inst(iid).lease_owner == PAUSED_OWNER
    assert not HistoryEvent.objects.filter(instance_id=iid, command="receive").exists()
    sv.signal(iid, "go", "after")
    sv.unpause_workflow(iid)
    result = sv.wait_workflow(iid, timeout=20)
    assert result.output == ["running", "after"]


def test_pausing_fences_out_a_running_execution_which_runs_again_after_the_unpause(
    make_worker: Any, gates: dict[str, threading.Event]
) -> None:
    gates["gated"] = threading.Event()
    iid = sv.start_workflow("pause.gated", None)
    make_worker()
    assert pauses.AT_GATE.wait(20)
    leased = inst(iid)
    assert leased.lease_owner not in ("", PAUSED_OWNER)
    sv.pause_workflow(iid)
    gates["gated"].set()
    # The execution's first write is fenced: no history is written while paused.
    paused = inst(iid)
    assert paused.lease_epoch == leased.lease_epoch + 1
    assert paused.runnable
    wait_until(lambda: not HistoryEvent.objects.filter(instance_id=iid).exists(), timeout=5)
    assert not ActivityTask.objects.filter(instance_id=iid).exists()
    sv.unpause_workflow(iid)
    assert sv.wait_workflow(iid, timeout=20).output == "after the gate"


def test_two_workers_leave_a_paused_instance_alone_and_one_runs_it_after(
    make_worker: Any,
) -> None:
    iid = sv.start_workflow("pause.receive", None)
    make_worker(worker_id="one")
    make_worker(worker_id="two")
    # Suspended at its receive: unleased and not runnable.
    wait_until(lambda: inst(iid).parked_key != "" and inst(iid).lease_owner == "")
    sv.pause_workflow(iid)
    sv.signal(iid, "go", 1)
    # A witness started after the pause completes on those same workers.
    witness = sv.start_workflow("pause.other", "witness")
    assert sv.wait_workflow(witness, timeout=20).output == "witness"
    assert sv.describe(iid).status == "running"
    assert inst(iid).lease_owner == PAUSED_OWNER
    sv.unpause_workflow(iid)
    assert sv.wait_workflow(iid, timeout=20).output == 1
    # One execution after the unpause: one receive, consumed once.
    assert HistoryEvent.objects.filter(instance_id=iid, command="receive").count() == 1


def test_bulk_pause_and_unpause_by_selection(tdb: None) -> None:
    ids = [sv.start_workflow("pause.receive", None, instance_id=f"bulk-{n}") for n in range(5)]
    other = sv.start_workflow("pause.timers", None)
    drive()
    batches = list(sv_select(paused=False, workflow_name="pause.receive", batch=2))
    assert [len(batch) for batch in batches] == [2, 2, 1]
    for batch in batches:
        for instance_id in batch:
            sv.pause_workflow(instance_id, reason="bulk")
    assert all(sv.describe(i).paused for i in ids)
    assert not sv.describe(other).paused
    assert [i for batch in sv_select(paused=True) for i in batch] == sorted(ids)
    assert list(sv_select(paused=False, workflow_name="pause.receive")) == []


def sv_select(**kwargs: Any) -> Any:
    from selvedge_django.operations import select_paused

    return select_paused(**kwargs)


# -- queues --------------------------------------------------------------------------------


def test_a_paused_queue_keeps_its_tasks_queued_for_claims_and_inline_claims(tdb: None) -> None:
    assert sv.pause_queue("pq") is True
    assert sv.pause_queue("pq") is False  # paused already: nothing changes
    held = sv.start_workflow("pause.activity", "held")
    witness = sv.start_workflow("pause.other", "free")
    drive()
    assert sv.get_workflow_result(witness).output == "free"
    task = ActivityTask.objects.get(instance_id=held)
    assert (task.status, task.attempts, task.held) == ("queued", 0, False)
    assert client_store().claim_task(held, task.key, "inline-worker") is None
    assert ActivityQueue.objects.get(name="pq").paused
    assert sv.unpause_queue("pq") is True
    assert sv.unpause_queue("pq") is False
    drive()
    assert sv.get_workflow_result(held).output == "held"


def test_list_queues_says_which_are_paused_and_what_they_hold(tdb: None) -> None:
    sv.pause_queue("pq")
    sv.pause_queue("idle")
    sv.start_workflow("pause.activity", 1)
    sv.start_workflow("pause.activity", 2)
    drive(activity_queues=["other"])
    queues = {queue.name: queue for queue in sv.list_queues()}
    assert queues["pq"] == sv.QueueInfo(
        name="pq",
        paused=True,
        queued=2,
        running=0,
        oldest_queued_age_s=queues["pq"].oldest_queued_age_s,
    )
    assert queues["pq"].oldest_queued_age_s is not None
    assert (queues["idle"].paused, queues["idle"].queued) == (True, 0)
    sv.unpause_queue("idle")
    assert {q.name: q.paused for q in sv.list_queues()}["idle"] is False
    assert queues["pq"].to_json()["paused"] is True


def test_queue_names_are_validated(tdb: None) -> None:
    with pytest.raises(ValueError):
        sv.pause_queue("a\x00b")
    with pytest.raises(ValueError):
        sv.pause_queue("q" * 256)
    assert not ActivityQueue.objects.exists()
    assert sv.pause_queue("") is True  # the default queue
    assert sv.unpause_queue("") is True


def test_a_worker_hears_of_a_queue_pause_by_another_store_of_its_process_at_once(
    tdb: None,
) -> None:
    # The worker read the paused queues (none) and would keep them for its poll interval
    # (60 s here); a pause through another store of this process reaches it through the
    # process's bus at commit (other processes: NOTIFY, tests/processes/test_pause_processes.py).
    worker = Worker(activity_poll_interval=60)
    assert "pq" not in worker.store.limits._skipped_queues()
    other = type(worker.store)(worker.store.alias, worker.store.codec)
    other.pauses.set_queue_paused("pq", True)
    assert "pq" in worker.store.limits._skipped_queues()
    other.pauses.set_queue_paused("pq", False)
    assert "pq" not in worker.store.limits._skipped_queues()
