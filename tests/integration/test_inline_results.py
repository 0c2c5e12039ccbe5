"""An inline attempt's result commits with the execution's next write (one commit a step).

The value reaches the workflow code at once; the next fenced write (the next
reservation, the suspension's release, the close) records it first, in its own
transaction. Between the two, the claim may lapse (the write then fails whole and
the run replays: only that activity runs again) or the lease may be taken away
(the write is fenced out; the result is still recorded on its own, so nothing
runs twice).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, SignalMessage, WorkflowInstance
from selvedge_django.testing import ControllableClock, FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.workflows import inline

QUIET: dict[str, Any] = {"run_local_starts": False}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    inline.RUNS.clear()
    inline.AFTER_BODY.clear()
    yield
    inline.RUNS.clear()
    inline.AFTER_BODY.clear()


def task(instance_id: str, name: str) -> tuple[str, int, int]:
    row = ActivityTask.objects.get(instance_id=instance_id, input=f'"{name}"')
    return row.status, row.attempts, row.failures


def test_the_result_and_the_next_reservation_commit_in_one_transaction(tdb: None) -> None:
    iid = sv.start_workflow("inline.two_steps", None)
    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker(**QUIET))
    finally:
        injector.uninstall()
    assert sv.get_workflow_result(iid).output == ["a:1", "b:1"]
    # No completion of its own: step a's result is written by step b's reservation, and
    # step b's by the close.
    operations = [s.operation for s in injector.statements if s.instance_id == iid]
    assert "complete_task" not in operations
    reserve_b = [
        s
        for s in injector.statements
        if s.operation == "reserve_activity" and s.instance_id == iid and s.call == 2
    ]
    assert any("activitytask" in s.sql.lower() and "completed" in str(s.params) for s in reserve_b)
    assert task(iid, "a") == ("completed", 1, 0)
    assert task(iid, "b") == ("completed", 1, 0)
    sv.replay_instance(iid)


def test_a_claim_that_lapses_before_the_next_write_reruns_only_that_activity(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("inline.two_steps", None)
    # After a's body, before the write that would record it: past its claim (10 s).
    inline.AFTER_BODY.append(lambda: selvedge_clock.advance(60))
    worker = Worker(**QUIET)
    run_until_idle(worker)
    assert sv.get_workflow_result(iid).output == ["a:2", "b:1"]
    # The lapse is an attempt and a failure, as for any claim its holder lost; the
    # second attempt's value is the one recorded, once.
    assert task(iid, "a") == ("completed", 2, 1)
    assert inline.RUNS == {"a": 2, "b": 1}
    values = list(
        HistoryEvent.objects.filter(instance_id=iid, command="activity")
        .order_by("seq")
        .values_list("data", flat=True)
    )
    assert values == ['"a:2"', '"b:1"']
    sv.replay_instance(iid)


def test_a_claim_that_lapses_before_the_close_reruns_the_activity_and_closes_once(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("inline.one_step", None)
    inline.AFTER_BODY.append(lambda: selvedge_clock.advance(60))
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(iid).output == "a:2"
    assert task(iid, "a") == ("completed", 2, 1)
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    sv.replay_instance(iid)


def test_a_result_whose_write_was_fenced_out_is_recorded_on_its_own(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    iid = sv.start_workflow("inline.two_steps", None)

    def take_the_lease() -> None:
        # Another execution's lease (a new epoch): this one's next write is fenced out.
        WorkflowInstance.objects.filter(instance_id=iid).update(lease_epoch=F("lease_epoch") + 1)

    inline.AFTER_BODY.append(take_the_lease)
    worker = Worker(**QUIET)
    run_until_idle(worker)
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert inst.status == "running"
    # a's result is recorded although the write that was to carry it failed.
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    assert task(iid, "a") == ("completed", 1, 0)
    # Once the taken lease expires, the run goes on from what is recorded: a ran once.
    selvedge_clock.advance(120)
    run_until_idle(worker)
    assert sv.get_workflow_result(iid).output == ["a:1", "b:1"]
    assert inline.RUNS == {"a": 1, "b": 1}


def test_a_close_fenced_out_keeps_its_result_recorded_once(
    tdb: None, selvedge_clock: ControllableClock
) -> None:
    """The close that was to carry a's result finds the lease taken: nothing closes, a's
    result stays recorded (on PostgreSQL by the close's own statement, on SQLite on its
    own after the close rolled back), and the next holder closes without running a."""
    iid = sv.start_workflow("inline.one_step", None)
    inline.AFTER_BODY.append(
        lambda: WorkflowInstance.objects.filter(instance_id=iid).update(
            lease_epoch=F("lease_epoch") + 1
        )
    )
    worker = Worker(**QUIET)
    run_until_idle(worker)
    assert WorkflowInstance.objects.get(instance_id=iid).status == "running"
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    assert task(iid, "a") == ("completed", 1, 0)
    selvedge_clock.advance(120)
    run_until_idle(worker)
    assert sv.get_workflow_result(iid).output == "a:1"
    assert inline.RUNS == {"a": 1}
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    sv.replay_instance(iid)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-statement close")
def test_the_close_and_the_result_it_carries_are_one_statement_on_postgresql(tdb: None) -> None:
    iid = sv.start_workflow("inline.one_step", None)
    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker(**QUIET))
    finally:
        injector.uninstall()
    assert sv.get_workflow_result(iid).output == "a:1"
    assert task(iid, "a") == ("completed", 1, 0)
    closing = [s for s in injector.statements if s.instance_id == iid and s.operation == "close"]
    # One write; then, after its commit, the waiters' hint on its own (is_waiter_hint).
    hint = [s.sql.startswith("SELECT pg_notify") for s in closing]
    assert hint == [False, True], [s.sql for s in closing]
    assert "complete_task" not in {s.operation for s in injector.statements}


def test_a_suspension_records_the_result_with_the_release(tdb: None) -> None:
    iid = sv.start_workflow("inline.then_wait", None)
    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker(**QUIET))
    finally:
        injector.uninstall()
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert (inst.status, inst.lease_owner) == ("running", "")
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    assert task(iid, "a") == ("completed", 1, 0)
    operations = {s.operation for s in injector.statements if s.instance_id == iid}
    assert "complete_task" not in operations
    sv.signal(iid, "go", "now")
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(iid).output == ["a:1", "now"]
    assert inline.RUNS == {"a": 1}


def test_a_failing_write_leaves_the_result_to_be_recorded_on_its_own(tdb: None) -> None:
    """A statement of the write that carries a's result (b's reservation) fails: it rolls
    back whole, the execution stops on the storage error, and a's result is recorded by
    itself, so the replay that follows does not run a again."""
    iid = sv.start_workflow("inline.two_steps", None)
    worker = Worker(**QUIET, execution_error_backoff=0.01)
    injector = FaultInjector().install()
    try:
        fault = injector.fail_statement(
            r"INSERT INTO \S*historyevent", 2, operation="reserve_activity", instance_id=iid
        )
        run_until_idle(worker)
        assert fault.fired == 1
    finally:
        injector.uninstall()
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    for _ in range(200):
        if sv.describe(iid).status != "running":
            break
        run_until_idle(worker)
    assert sv.get_workflow_result(iid).output == ["a:1", "b:1"]
    assert inline.RUNS == {"a": 1, "b": 1}
    assert task(iid, "a") == ("completed", 1, 0)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-statement writes")
def test_the_reservation_and_the_result_it_carries_are_one_statement_on_postgresql(
    tdb: None,
) -> None:
    iid = sv.start_workflow("inline.two_steps", None)
    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker(**QUIET))
    finally:
        injector.uninstall()
    assert sv.get_workflow_result(iid).output == ["a:1", "b:1"]
    reserving_b = [
        s
        for s in injector.statements
        if s.operation == "reserve_activity" and s.instance_id == iid and s.call == 2
    ]
    assert len(reserving_b) == 1, [s.sql for s in reserving_b]
    assert task(iid, "a") == ("completed", 1, 0)


def test_a_cancel_request_before_the_next_reservation_keeps_the_result_and_cancels_the_next(
    tdb: None,
) -> None:
    """A cancel request arrives while a runs inline: a's result is recorded once, b is
    recorded cancelled without running, and the run ends cancelled."""
    iid = sv.start_workflow("inline.two_steps", None)
    inline.AFTER_BODY.append(lambda: sv.cancel_workflow(iid, "stop"))
    run_until_idle(Worker(**QUIET))
    assert sv.describe(iid).status == "cancelled"
    assert inline.RUNS == {"a": 1}
    assert task(iid, "a") == ("completed", 1, 0)
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    assert task(iid, "b")[0] == "cancelled"
    sv.replay_instance(iid)


def test_receiving_a_signal_commits_the_row_the_signal_and_the_batch_together(
    tdb: None,
) -> None:
    """The fence, the consumed signal, the received row and the delivery batch (here
    also a signal on another channel) commit together, on PostgreSQL as one statement
    that also reads the cancel state and finds the signal (no read of either before
    it), and replay agrees."""
    iid = sv.start_workflow("inline.then_wait", None)
    run_until_idle(Worker(**QUIET))
    sv.signal(iid, "other", 1)
    sv.signal(iid, "go", "now")
    injector = FaultInjector(trace=True).install()
    try:
        run_until_idle(Worker(**QUIET))
    finally:
        injector.uninstall()
    assert sv.get_workflow_result(iid).output == ["a:1", "now"]
    observing = [
        s
        for s in injector.statements
        if s.instance_id == iid and s.operation in ("observe", "receive_next")
    ]
    if connection.vendor == "postgresql":
        assert len(observing) == 1, [s.sql for s in observing]
        operations = [s.operation for s in injector.statements if s.instance_id == iid]
        assert "cancel_state" not in operations, operations
        assert "next_signal" not in operations, operations
    rows = dict(HistoryEvent.objects.filter(instance_id=iid).values_list("key", "delivered_seq"))
    received = HistoryEvent.objects.get(instance_id=iid, command="receive")
    assert rows[received.key] == received.seq
    signals = sorted(
        SignalMessage.objects.filter(instance_id=iid).values_list(
            "channel", "delivered_seq", "consumed_seq"
        )
    )
    assert signals == [("go", received.seq, received.seq), ("other", received.seq, None)]
    sv.replay_instance(iid)


taken = threading.Event()


def _take_the_lease_while_the_next_write_waits(iid: str, done: list[BaseException | None]) -> None:
    """Another worker takes the lease in a transaction that commits only once the next
    write of this execution waits for the instance row (that write's statement then
    started before the new holder was committed)."""
    try:
        with transaction.atomic():
            WorkflowInstance.objects.filter(instance_id=iid).update(
                lease_owner="other-worker", lease_epoch=F("lease_epoch") + 1, runnable=False
            )
            taken.set()
            deadline = time.monotonic() + 30
            with connection.cursor() as cursor:
                while time.monotonic() < deadline:
                    cursor.execute("SELECT pg_stat_clear_snapshot()")
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.005)
                else:
                    raise AssertionError("the next write never waited for the instance row")
        done.append(None)
    except BaseException as error:  # reported by the test
        done.append(error)
    finally:
        connection.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement, one snapshot")
def test_a_receive_whose_lease_changes_hands_mid_statement_consumes_nothing(tdb: None) -> None:
    """The receive's one statement found the signal, then waited for the instance row
    while another worker took the lease: it is fenced out with the signal unconsumed and
    no row recorded, and the instance's next holder receives it once."""
    iid = sv.start_workflow("inline.then_wait", None)
    run_until_idle(Worker(**QUIET))
    sv.signal(iid, "go", "now")
    done: list[BaseException | None] = []
    taken.clear()
    other = threading.Thread(target=_take_the_lease_while_the_next_write_waits, args=(iid, done))

    def race(execute: Any, sql: str, *args: Any) -> Any:
        if sql.startswith("WITH n AS") and not other.is_alive() and not done:
            other.start()
            assert taken.wait(30)
        return execute(sql, *args)

    with connection.execute_wrapper(race):
        run_until_idle(Worker(**QUIET))
    other.join(30)
    assert done == [None]
    assert SignalMessage.objects.get(instance_id=iid).consumed_seq is None
    assert not HistoryEvent.objects.filter(instance_id=iid, command="receive").exists()
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert (inst.lease_owner, inst.status) == ("other-worker", "running")
    # The other worker is gone: its lease lapses and the next holder receives the signal.
    WorkflowInstance.objects.filter(instance_id=iid).update(lease_expires_ms=0)
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(iid).output == ["a:1", "now"]
    assert SignalMessage.objects.get(instance_id=iid).consumed_seq is not None
    sv.replay_instance(iid)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement, one snapshot")
@pytest.mark.parametrize("workflow", ["inline.two_steps", "inline.one_step"])
def test_a_result_recorded_as_the_lease_changes_hands_wakes_the_new_holder(
    tdb: None, workflow: str
) -> None:
    """The write carrying a's result (b's reservation, or the close) started while another
    worker was taking the lease: it is fenced out, a's result stays recorded, and the new
    holder, which may have read the history before it, is woken to see it."""
    iid = sv.start_workflow(workflow, None)
    done: list[BaseException | None] = []
    taken.clear()
    other = threading.Thread(target=_take_the_lease_while_the_next_write_waits, args=(iid, done))

    def race() -> None:
        other.start()
        assert taken.wait(30)

    inline.AFTER_BODY.append(race)
    run_until_idle(Worker(**QUIET))
    other.join(30)
    assert done == [None]
    assert HistoryEvent.objects.get(instance_id=iid, seq=1).data == '"a:1"'
    assert task(iid, "a") == ("completed", 1, 0)
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert (inst.lease_owner, inst.status) == ("other-worker", "running")
    assert inst.runnable, "the new holder was not woken for the result recorded under it"
