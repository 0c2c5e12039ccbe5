"""resume_workflow: a closed instance runs again in place (SPEC section 11).

The rows from the cut on and the close move to the archive under the generation
they belonged to (nothing is deleted); the instance runs under a new lease epoch
and the next generation and replays with the current code: kept rows return
their values, archived steps run again. Every statement of the resume's
transaction is failed in turn: each failure leaves the instance exactly as it
was, and the resume that follows works.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    WorkflowInstance,
)
from selvedge_django.operations import client_store as _store
from selvedge_django.testing import FaultInjector, InjectedFault, run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.models import Ledger
from tests.testapp.workflows import recovery as resume_flows

QUIET = {"run_local_starts": False}


@pytest.fixture(autouse=True)
def broken() -> Iterator[set[str]]:
    resume_flows.BROKEN.clear()
    resume_flows.RUNS.clear()
    yield resume_flows.BROKEN
    resume_flows.BROKEN.clear()
    resume_flows.RUNS.clear()


def drive(instance_id: str, *, status: str | None = None, timeout: float = 30.0) -> str:
    """Run an inline worker until the instance is closed (or has ``status``)."""
    deadline = time.monotonic() + timeout
    worker = Worker(**QUIET)
    while True:
        run_until_idle(worker)
        current = WorkflowInstance.objects.get(instance_id=instance_id).status
        if (status is None and current != "running") or current == status:
            return current
        assert time.monotonic() < deadline, f"{instance_id} still {current}"


def history(instance_id: str) -> list[tuple[str, str]]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("id")
        .values_list("key", "event_type")
    )


def archived(instance_id: str) -> list[tuple[int, str, str]]:
    return list(
        ArchivedHistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("generation", "event_id")
        .values_list("generation", "key", "event_type")
    )


def state(instance_id: str) -> dict[str, Any]:
    """Everything a resume may change, to compare before and after a failed one."""
    inst = WorkflowInstance.objects.filter(instance_id=instance_id).values().get()
    inst.pop("updated_at")
    return {
        "instance": inst,
        "history": list(HistoryEvent.objects.filter(instance_id=instance_id).values()),
        "archive": list(ArchivedHistoryEvent.objects.filter(instance_id=instance_id).values()),
        "tasks": list(ActivityTask.objects.filter(instance_id=instance_id).values()),
        "signals": list(SignalMessage.objects.filter(instance_id=instance_id).values()),
    }


def failed_order(name: str = "o-1") -> str:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.order", name, instance_id=name)
    sv.signal(iid, "go", {"by": "ops"})
    assert drive(iid) == "failed"
    return iid


def closed_in_every_way() -> dict[str, str]:
    """One run of each kind a selection can hold, by what it is."""
    runs = {"failed": failed_order("mix-failed")}
    resume_flows.BROKEN.clear()
    for kind in ("completed", "cancelled", "terminated", "running"):
        runs[kind] = sv.start_workflow("resume.order", kind, instance_id=f"mix-{kind}")
        drive(runs[kind], status="running")
    sv.signal(runs["completed"], "go", "yes")
    assert drive(runs["completed"]) == "completed"
    sv.cancel_workflow(runs["cancelled"])
    assert drive(runs["cancelled"]) == "cancelled"
    sv.terminate_workflow(runs["terminated"], reason="by hand")
    return runs


def test_resume_reruns_the_failed_step_with_a_fresh_budget_and_keeps_the_rest(
    tdb: None,
) -> None:
    iid = failed_order()
    before = WorkflowInstance.objects.get(instance_id=iid)
    assert resume_flows.RUNS == {"reserve": 1, "charge": 2}
    recorded = history(iid)
    failed_key = next(key for key, event in recorded if event == "ActivityFailed")
    resume_flows.BROKEN.clear()

    assert sv.resume_workflow(iid, reason="card fixed") == 2
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert (inst.status, inst.generation, inst.resumed_count) == ("running", 2, 1)
    assert inst.lease_epoch == before.lease_epoch + 1
    assert (inst.error, inst.closed_at, inst.runnable) == (None, None, True)
    # The failed step and the close are archived under generation 1, with the task's
    # summary; the rows before it stay.
    assert archived(iid) == [(1, failed_key, "ActivityFailed"), (1, "$close", "WorkflowFailed")]
    task = json.loads(ArchivedHistoryEvent.objects.get(instance_id=iid, key=failed_key).task)
    assert (task["name"], task["status"], task["attempts"], task["failures"]) == (
        "resume.charge",
        "failed",
        2,
        2,
    )
    assert history(iid) == [row for row in recorded if row[0] not in (failed_key, "$close")]

    assert drive(iid) == "completed"
    result = sv.get_workflow_result(iid)
    assert result.output == {
        "reserved": "reserved o-1",
        "go": {"by": "ops"},
        "charged": "charged o-1",
    }
    # reserve returned its recorded value; charge ran again once, under a new task.
    assert resume_flows.RUNS == {"reserve": 1, "charge": 3}
    (new_task,) = ActivityTask.objects.filter(instance_id=iid, key=failed_key)
    assert (new_task.status, new_task.attempts, new_task.failures) == ("completed", 1, 0)
    description = sv.describe(iid)
    assert (description.generation, description.resumed_count, description.forked_from) == (
        2,
        1,
        None,
    )
    sv.replay_instance(iid)


def test_a_failed_run_resumed_before_the_fix_fails_again_and_is_archived_twice(
    tdb: None,
) -> None:
    iid = failed_order()
    sv.resume_workflow(iid)
    assert drive(iid) == "failed"
    resume_flows.BROKEN.clear()
    assert sv.resume_workflow(iid) == 3
    assert drive(iid) == "completed"
    generations = [generation for generation, _, _ in archived(iid)]
    assert generations == [1, 1, 2, 2]
    # Exactly once per generation: each key at most once in each.
    rows = archived(iid)
    assert len({(g, k) for g, k, _ in rows}) == len(rows)


def test_signals_consumed_by_archived_rows_return_to_the_inbox_in_order(tdb: None) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.signals", None)
    sv.signal(iid, "in", "first")
    sv.signal(iid, "in", "second")
    assert drive(iid) == "failed"
    first_receive = next(key for key, event in history(iid) if event == "SignalReceived")
    resume_flows.BROKEN.clear()
    sv.resume_workflow(iid, from_key=first_receive)
    pending = list(
        SignalMessage.objects.filter(instance_id=iid)
        .order_by("id")
        .values_list("payload", "delivered_seq", "consumed_seq", "consumed_key")
    )
    assert pending == [('"first"', None, None, ""), ('"second"', None, None, "")]
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == ["first", "second"]
    sv.replay_instance(iid)


def test_a_child_started_again_re_attaches_to_the_existing_instance(tdb: None) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.parent", "p", instance_id="p")
    assert drive(iid) == "failed"
    assert WorkflowInstance.objects.get(instance_id="p-child").status == "failed"
    resume_flows.BROKEN.clear()
    # The child first: its own re-run completes it; the parent's failed row then
    # re-attaches to it and receives that outcome.
    sv.resume_workflow("p-child")
    assert drive("p-child") == "completed"
    sv.resume_workflow(iid)
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == "charged p"
    assert WorkflowInstance.objects.filter(parent_instance_id=iid).count() == 1
    sv.replay_instance(iid)


def test_a_resumed_parent_re_attaches_to_a_running_child(tdb: None) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.parent", "q", instance_id="q")
    assert drive(iid) == "failed"
    sv.resume_workflow(iid)
    sv.resume_workflow("q-child")
    resume_flows.BROKEN.clear()
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == "charged q"


def test_a_terminated_run_resumes_from_its_first_unfinished_row(tdb: None) -> None:
    iid = sv.start_workflow("terminate.everything", None)
    run_until_idle(Worker(activity_queues=[""], run_local_starts=False))
    keys = [key for key, _ in history(iid)]
    sv.terminate_workflow(iid, reason="stuck")
    sv.resume_workflow(iid)
    # The child, the activity and the timer were left open by the terminate: the cut
    # moves to the first of them, so each runs again (the child re-attaches).
    assert [key for _, key, _ in archived(iid)] == [*keys, "$close"]
    assert history(iid) == []
    assert not ActivityTask.objects.filter(instance_id=iid).exists()
    run_until_idle(Worker(activity_queues=[""], run_local_starts=False))
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert inst.status == "running"
    assert [key for key, _ in history(iid)] == keys
    assert ActivityTask.objects.get(instance_id=iid).status == "queued"
    assert WorkflowInstance.objects.filter(parent_instance_id=iid).count() == 1


def test_a_run_that_failed_on_its_own_error_archives_only_the_close(tdb: None) -> None:
    resume_flows.BROKEN.update({"charge", "caught"})
    iid = sv.start_workflow("resume.caught", "c")
    assert drive(iid) == "failed"
    kept = history(iid)[:-1]
    resume_flows.BROKEN.clear()
    sv.resume_workflow(iid)
    assert archived(iid) == [(1, "$close", "WorkflowFailed")]
    assert history(iid) == kept
    assert drive(iid) == "completed"
    assert resume_flows.RUNS["charge"] == 2  # the caught failure stays recorded


def test_resume_rejects_running_unknown_and_bad_keys_writing_nothing(tdb: None) -> None:
    running = sv.start_workflow("resume.signals", None)
    with pytest.raises(sv.InvalidWorkflowState):
        sv.resume_workflow(running)
    with pytest.raises(sv.WorkflowNotFound):
        sv.resume_workflow("nobody")
    iid = failed_order()
    before = state(iid)
    with pytest.raises(sv.HistoryKeyConflict):
        sv.resume_workflow(iid, from_key="no-such-key")
    with pytest.raises(TypeError):
        sv.resume_workflow(iid, reason=3)  # type: ignore[arg-type]
    assert state(iid) == before


def test_a_worker_holding_the_old_epoch_cannot_write_after_a_resume(tdb: None) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.signals", None)
    store = _store()
    fence = store.instances.acquire(iid, "stale-worker", 30)
    assert fence is not None
    sv.terminate_workflow(iid)
    sv.resume_workflow(iid)
    from selvedge_django.engine.events import HistoryRow

    with pytest.raises(sv.Fenced):
        store.record_command(fence, HistoryRow(key="x", seq=0, command="now", data="1"))
    assert history(iid) == []


def test_a_signal_sent_around_a_resume_is_kept(tdb: None) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.signals", None)
    sv.signal(iid, "in", "first")
    sv.signal(iid, "in", "second")
    assert drive(iid) == "failed"
    with pytest.raises(sv.InstanceClosed):
        sv.signal(iid, "in", "while closed")
    resume_flows.BROKEN.clear()
    first_receive = next(key for key, event in history(iid) if event == "SignalReceived")
    sv.resume_workflow(iid, from_key=first_receive)
    sv.signal(iid, "in", "after")
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == ["first", "second"]
    assert SignalMessage.objects.filter(instance_id=iid, consumed_seq__isnull=True).count() == 1


def test_aresume_workflow(tdb: None) -> None:
    iid = failed_order("a-1")
    resume_flows.BROKEN.clear()

    async def view() -> int:
        try:
            return await sv.aresume_workflow(iid)
        finally:
            await sync_to_async(connections.close_all)()

    assert asyncio.run(view()) == 2


def resume_statements(iid: str) -> int:
    """How many statements one resume of ``iid`` runs (then undone by a rollback)."""
    injector = FaultInjector(trace=True).install()
    try:
        with pytest.raises(InjectedFault):
            # Fail the last statement so nothing commits, after counting the rest.
            injector.fail_statement(r"DELETE FROM .*history", operation="resume")
            sv.resume_workflow(iid)
        return max(
            s.step for s in injector.statements if s.operation == "resume" and not s.waiter_hint
        )
    finally:
        injector.uninstall()


def test_a_failing_statement_at_each_step_of_a_resume_leaves_everything_as_it_was(
    tdb: None,
) -> None:
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.signals", None)
    sv.signal(iid, "in", "first")
    sv.signal(iid, "in", "second")
    assert drive(iid) == "failed"
    first_receive = next(key for key, event in history(iid) if event == "SignalReceived")
    before = state(iid)
    steps = resume_statements(iid)
    assert steps >= 8
    assert state(iid) == before
    for step in range(1, steps + 1):
        injector = FaultInjector().install()
        try:
            fault = injector.fail_statement(None, operation="resume", step=step)
            with pytest.raises(InjectedFault):
                sv.resume_workflow(iid, from_key=first_receive)
            assert fault.fired == 1
        finally:
            injector.uninstall()
        assert state(iid) == before, f"step {step} left a partial write"
    resume_flows.BROKEN.clear()
    sv.resume_workflow(iid, from_key=first_receive)
    assert drive(iid) == "completed"
    sv.replay_instance(iid)
    assert connection.vendor in ("sqlite", "postgresql")


def test_an_ambiguous_commit_of_a_resume_is_seen_by_the_next_call(tdb: None) -> None:
    iid = failed_order()
    injector = FaultInjector().install()
    try:
        injector.fail_after_commit(r"DELETE FROM .*history", operation="resume")
        with pytest.raises(InjectedFault):
            sv.resume_workflow(iid)
    finally:
        injector.uninstall()
    # Committed: a second resume is refused, nothing is archived twice.
    with pytest.raises(sv.InvalidWorkflowState):
        sv.resume_workflow(iid)
    assert [g for g, _, _ in archived(iid)] == [1, 1]
    resume_flows.BROKEN.clear()
    assert drive(iid) == "completed"


# -- fork ------------------------------------------------------------------------------


def test_fork_copies_the_history_before_the_failure_and_leaves_the_source_untouched(
    tdb: None,
) -> None:
    iid = failed_order("f-1")
    before = state(iid)
    resume_flows.BROKEN.clear()
    new = sv.fork_workflow(iid)
    assert new == "f-1/fork-1"
    assert state(iid) == before
    description = sv.describe(new)
    assert (description.forked_from, description.workflow_name, description.status) == (
        iid,
        "resume.order",
        "running",
    )
    failed_key = next(key for key, event in history(iid) if event == "ActivityFailed")
    kept = [row for row in history(iid) if row[0] not in (failed_key, "$close")]
    assert history(new) == kept
    # The signal the copied receive consumed is copied with its position.
    (copied,) = SignalMessage.objects.filter(instance_id=new)
    assert copied.consumed_seq is not None
    assert drive(new) == "completed"
    assert resume_flows.RUNS == {"reserve": 1, "charge": 3}
    assert sv.get_workflow_result(new).output["charged"] == "charged f-1"
    assert state(iid) == before
    sv.replay_instance(new)
    assert sv.fork_workflow(iid, new_instance_id="mine") == "mine"
    assert sv.fork_workflow(iid) == "f-1/fork-3"


def test_fork_of_a_completed_run_from_a_key_reruns_from_there(tdb: None) -> None:
    iid = sv.start_workflow("resume.signals", None)
    sv.signal(iid, "in", "first")
    sv.signal(iid, "in", "second")
    assert drive(iid) == "completed"
    # Every row but the close by default: the fork completes at once.
    whole = sv.fork_workflow(iid)
    assert history(whole) == history(iid)[:-1]
    assert drive(whole) == "completed"
    assert sv.get_workflow_result(whole).output == ["first", "second"]
    first_receive = next(key for key, event in history(iid) if event == "SignalReceived")
    partial = sv.fork_workflow(iid, from_key=first_receive)
    pending = list(
        SignalMessage.objects.filter(instance_id=partial)
        .order_by("id")
        .values_list("payload", "consumed_seq")
    )
    assert pending == [('"first"', None), ('"second"', None)]
    assert drive(partial) == "completed"
    assert sv.get_workflow_result(partial).output == ["first", "second"]


def test_fork_rejects_unknown_sources_keys_and_taken_ids_writing_nothing(tdb: None) -> None:
    iid = failed_order("f-2")
    with pytest.raises(sv.WorkflowNotFound):
        sv.fork_workflow("nobody")
    with pytest.raises(sv.HistoryKeyConflict):
        sv.fork_workflow(iid, from_key="nope")
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.fork_workflow(iid, new_instance_id=iid)
    with pytest.raises(sv.WorkflowStartRejected):
        sv.fork_workflow(iid, new_instance_id="")
    assert WorkflowInstance.objects.count() == 1


def test_a_failing_statement_at_each_step_of_a_fork_writes_nothing(tdb: None) -> None:
    iid = failed_order("f-3")
    before = state(iid)
    injector = FaultInjector(trace=True).install()
    try:
        sv.fork_workflow(iid, new_instance_id="probe")
        steps = max(
            s.step for s in injector.statements if s.operation == "fork" and not s.waiter_hint
        )
    finally:
        injector.uninstall()
    WorkflowInstance.objects.filter(instance_id="probe").delete()
    assert steps >= 6
    for step in range(1, steps + 1):
        injector = FaultInjector().install()
        try:
            fault = injector.fail_statement(None, operation="fork", step=step)
            with pytest.raises(InjectedFault):
                sv.fork_workflow(iid)
            assert fault.fired == 1
        finally:
            injector.uninstall()
        assert WorkflowInstance.objects.count() == 1, f"step {step} left a partial write"
        assert not HistoryEvent.objects.exclude(instance_id=iid).exists()
        assert not SignalMessage.objects.exclude(instance_id=iid).exists()
    assert state(iid) == before
    resume_flows.BROKEN.clear()
    new = sv.fork_workflow(iid)
    assert drive(new) == "completed"


def test_afork_workflow(tdb: None) -> None:
    iid = failed_order("f-4")

    async def view() -> str:
        try:
            return await sv.afork_workflow(iid, new_instance_id="f-4b")
        finally:
            await sync_to_async(connections.close_all)()

    assert asyncio.run(view()) == "f-4b"


# -- export and replay -----------------------------------------------------------------


def test_the_export_lists_archived_rows_with_their_generation_and_replays_the_current(
    tdb: None,
) -> None:
    iid = failed_order("x-1")
    plain = sv.export_history(iid).to_dict()
    assert "archived" not in plain
    resume_flows.BROKEN.clear()
    sv.resume_workflow(iid)
    assert drive(iid) == "completed"
    history_ = sv.export_history(iid)
    document = json.loads(history_.to_json())
    assert [(a["generation"], a["key"]) for a in document["archived"]] == [
        (1, next(k for k, e in archived_rows(iid) if e == "ActivityFailed")),
        (1, "$close"),
    ]
    assert document["archived"][0]["event_type"] == "ActivityFailed"
    assert document["archived"][0]["archived_at"]
    assert [e["key"] for e in document["events"]] == [k for k, _ in history(iid)]
    parsed = sv.parse_history(history_.to_json())
    assert parsed.to_dict() == document
    sv.replay_history(parsed)
    sv.replay_instance(iid)
    redacted = sv.export_history(iid, redact=True).to_dict()
    assert "$redacted" in json.dumps(redacted["archived"][0]["data"])
    bad = dict(document, archived=[dict(document["archived"][0], extra=1)])
    with pytest.raises(sv.UnsupportedHistoryFormat):
        sv.parse_history(json.dumps(bad))


def archived_rows(instance_id: str) -> list[tuple[str, str]]:
    return [(key, event) for _, key, event in archived(instance_id)]


def test_a_fork_replays_a_child_started_under_its_default_id(tdb: None) -> None:
    """The copied child row names the source's child (``<source>/<key>``); the fork's
    replay takes the recorded id instead of computing one from its own id."""
    resume_flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.default_child_parent", "dc", instance_id="dc")
    assert drive(iid) == "failed"
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=iid)
    assert child.instance_id.startswith(f"{iid}/") and child.status == "completed"
    resume_flows.BROKEN.clear()
    forked = sv.fork_workflow(iid)
    assert drive(forked) == "completed"
    assert sv.get_workflow_result(forked).output == {
        "reserved": "reserved dc",
        "charged": "charged dc",
    }
    # The child ran once, for the source; the fork started none of its own.
    assert resume_flows.RUNS["reserve"] == 1
    assert not WorkflowInstance.objects.filter(parent_instance_id=forked).exists()
    sv.replay_instance(forked)
    # A resume of the source replays the same row under the same id.
    sv.resume_workflow(iid)
    assert drive(iid) == "completed"
    sv.replay_instance(iid)


# -- resuming a cancelled run ------------------------------------------------------------


def settle(instance_id: str) -> str:
    """Run an inline worker serving the default queue only until nothing is left to do."""
    run_until_idle(Worker(activity_queues=[""], run_local_starts=False))
    return str(WorkflowInstance.objects.get(instance_id=instance_id).status)


def test_a_cancelled_run_resumes_where_it_was_cancelled_and_completes(tdb: None) -> None:
    iid = sv.start_workflow("resume.order", "k-1", instance_id="k-1")
    assert settle(iid) == "running"  # waiting for "go"
    sv.cancel_workflow(iid, reason="wrong day")
    assert drive(iid) == "cancelled"
    before = sv.export_history(iid).to_json()

    sv.resume_workflow(iid, reason="today is fine")
    # The wait that met the cancel request and the close go to the archive together.
    assert archived(iid) == [
        (1, "#2:receive:go", "SignalCancelled"),
        (1, "$close", "WorkflowCancelled"),
    ]
    assert settle(iid) == "running"  # waiting for "go" again, not cancelled
    sv.signal(iid, "go", {"by": "ops"})
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == {
        "reserved": "reserved k-1",
        "go": {"by": "ops"},
        "charged": "charged k-1",
    }
    assert resume_flows.RUNS == {"reserve": 1, "charge": 1}
    sv.replay_instance(iid)
    # The history exported before the resume still replays as it was: cancelled.
    sv.replay_history(sv.parse_history(before))


@pytest.mark.parametrize(
    "kind",
    ["sleep", "receive", "receive_with_timeout", "wait_condition", "timer_get", "future_get"],
)
def test_a_resumed_cancelled_run_waits_again_and_a_new_cancel_cancels_it(
    tdb: None, kind: str
) -> None:
    iid = sv.start_workflow("cancel.wait", {"kind": kind})
    assert settle(iid) == "running"
    sv.cancel_workflow(iid, reason="first")
    assert settle(iid) == "cancelled"

    sv.resume_workflow(iid)
    assert settle(iid) == "running"
    assert sv.describe(iid).status == "running"
    sv.cancel_workflow(iid, reason="second")
    assert settle(iid) == "cancelled"
    result = sv.get_workflow_result(iid)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert result.error.reason == "second"
    sv.replay_instance(iid)


def test_a_resumed_cancelled_run_archives_its_cleanup_and_runs_on(tdb: None) -> None:
    iid = sv.start_workflow("cancel.cleanup", None)
    assert settle(iid) == "running"
    sv.cancel_workflow(iid)
    assert settle(iid) == "cancelled"
    cleanup = [key for key, event in history(iid) if event == "ActivityCompleted"]
    assert len(cleanup) == 1

    sv.resume_workflow(iid)
    assert [key for _, key, _ in archived(iid)] == ["#1:receive:work", *cleanup, "$close"]
    assert settle(iid) == "running"
    sv.signal(iid, "work", "done")
    assert settle(iid) == "completed"
    assert sv.get_workflow_result(iid).output == "done"
    assert Ledger.objects.filter(entry=f"cleanup:{iid}").count() == 1
    sv.replay_instance(iid)


def test_a_cancelled_parent_resumed_after_its_cancelled_child_waits_for_it_again(
    tdb: None,
) -> None:
    iid = sv.start_workflow("cancel.wait", {"kind": "child_get"})
    assert settle(iid) == "running"
    (child_id,) = WorkflowInstance.objects.filter(parent_instance_id=iid).values_list(
        "instance_id", flat=True
    )
    sv.cancel_workflow(iid)
    assert settle(iid) == "cancelled"
    assert settle(child_id) == "cancelled"  # the parent's close cancelled it too

    sv.resume_workflow(child_id)
    sv.resume_workflow(iid)
    assert (settle(iid), settle(child_id)) == ("running", "running")
    assert WorkflowInstance.objects.filter(parent_instance_id=iid).count() == 1
    sv.cancel_workflow(iid, reason="second")
    assert (settle(iid), settle(child_id)) == ("cancelled", "cancelled")
    sv.replay_instance(iid)


def test_resume_only_failed_refuses_the_runs_that_closed_otherwise_writing_nothing(
    tdb: None,
) -> None:
    runs = closed_in_every_way()
    for kind in ("completed", "cancelled", "terminated"):
        before = state(runs[kind])
        with pytest.raises(sv.InvalidWorkflowState, match=f"is {kind}, not failed"):
            sv.resume_workflow(runs[kind], only_failed=True)
        assert state(runs[kind]) == before
    assert sv.resume_workflow(runs["failed"], only_failed=True) == 2
    with pytest.raises(TypeError):
        sv.resume_workflow(runs["completed"], only_failed="yes")  # type: ignore[arg-type]
