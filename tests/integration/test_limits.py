"""Limits: MAX_PAYLOAD_BYTES on every path a value takes, and the history length warning.

Each path is checked end to end with a real worker: the start input, a signal
payload, the workflow output, an activity's input and result, a child's input
and an activity's error. An oversized value is refused with an error that names
the limit, before anything about it is written; the workflow (where one runs)
sees a typed error it can handle and goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.conf import get_settings
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    WorkflowInstance,
)
from selvedge_django.worker import Worker
from tests.testapp.models import Ledger

LIMIT = 4096


@pytest.fixture
def small_limit(tdb: None) -> Iterator[Worker]:
    """MAX_PAYLOAD_BYTES = 4096 for the client and a started worker."""
    with override_settings(SELVEDGE={**settings.SELVEDGE, "MAX_PAYLOAD_BYTES": LIMIT}):
        worker = Worker()
        worker.start()
        try:
            yield worker
        finally:
            worker.stop(timeout=10)


def encoded(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def run(mode: str, size: int) -> sv.WorkflowResult:
    iid = sv.start_workflow("fault.limits", {"mode": mode, "size": size})
    return sv.wait_workflow(iid, timeout=30)


def test_the_default_limit_is_2_mib_and_a_value_of_exactly_that_size_is_accepted(
    tdb: None,
) -> None:
    limit = get_settings().max_payload_bytes
    assert limit == 2 * 1024 * 1024
    at_limit = "x" * (limit - 2)  # a JSON string: two quotes around it
    assert encoded(at_limit) == limit
    sv.start_workflow("fault.limits", at_limit, instance_id="at-limit")
    with pytest.raises(sv.WorkflowStartRejected, match="MAX_PAYLOAD_BYTES"):
        sv.start_workflow("fault.limits", at_limit + "x", instance_id="over-limit")
    assert list(WorkflowInstance.objects.values_list("instance_id", flat=True)) == ["at-limit"]


def test_an_oversized_start_input_is_rejected_naming_the_limit(small_limit: Worker) -> None:
    with pytest.raises(sv.WorkflowStartRejected) as caught:
        sv.start_workflow("fault.limits", {"pad": "x" * LIMIT}, instance_id="big-input")
    message = str(caught.value)
    assert f"limit (MAX_PAYLOAD_BYTES) is {LIMIT}" in message
    assert "not JSON" not in message
    assert isinstance(caught.value.__cause__, sv.PayloadTooLarge)
    assert not WorkflowInstance.objects.exists()


def test_an_oversized_signal_payload_is_refused_and_one_at_the_limit_arrives(
    small_limit: Worker,
) -> None:
    iid = sv.start_workflow("fault.limits", {"mode": "signal", "size": 0})
    with pytest.raises(sv.PayloadTooLarge, match=f"is {LIMIT + 1} bytes encoded"):
        sv.signal(iid, "big", "s" * (LIMIT - 1))
    assert not SignalMessage.objects.exists()
    sv.signal(iid, "big", "s" * (LIMIT - 2))
    result = sv.wait_workflow(iid, timeout=30)
    assert (result.status, result.output) == ("completed", LIMIT - 2)


def test_an_oversized_workflow_output_fails_the_workflow_with_nothing_stored(
    small_limit: Worker,
) -> None:
    result = run("output", LIMIT)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == "PayloadTooLarge"
    assert f"limit (MAX_PAYLOAD_BYTES) is {LIMIT}" in result.error.message
    inst = WorkflowInstance.objects.get(instance_id=result.instance_id)
    assert inst.output is None and len(inst.error or "") < LIMIT


def test_an_oversized_activity_result_is_a_final_failure_the_workflow_handles(
    small_limit: Worker,
) -> None:
    result = run("activity_result", LIMIT)
    assert result.status == "completed", result.error
    assert result.output["error"] == "PayloadTooLarge"
    assert f"limit (MAX_PAYLOAD_BYTES) is {LIMIT}" in result.output["message"]
    assert result.output["after"] == f"{result.instance_id}:after"
    # Retrying cannot make the result fit: one attempt, recorded as the final failure.
    task = ActivityTask.objects.get(instance_id=result.instance_id, name="fault.sized")
    assert (task.status, task.attempts) == ("failed", 1)
    assert Ledger.objects.filter(entry=f"fault.sized:{result.instance_id}").count() == 1
    row = HistoryEvent.objects.get(instance_id=result.instance_id, key=task.key)
    assert row.event_type == "ActivityFailed" and len(row.data or "") < LIMIT
    sv.replay_instance(result.instance_id)


def test_an_oversized_activity_input_is_refused_before_anything_is_reserved(
    small_limit: Worker,
) -> None:
    result = run("activity_input", LIMIT)
    assert result.status == "completed", result.error
    assert result.output["error"] == "PayloadTooLarge"
    assert "input of activity 'fault.sized'" in result.output["message"]
    assert list(
        ActivityTask.objects.filter(instance_id=result.instance_id).values_list("name", flat=True)
    ) == ["fault.step"]
    assert not HistoryEvent.objects.filter(
        instance_id=result.instance_id, key__contains="fault.sized"
    ).exists()
    sv.replay_instance(result.instance_id)


def test_an_oversized_child_input_refuses_the_child_start(small_limit: Worker) -> None:
    result = run("child_input", LIMIT)
    assert result.status == "completed", result.error
    assert result.output["error"] == "WorkflowStartRejected"
    assert "MAX_PAYLOAD_BYTES" in result.output["message"]
    assert "not JSON" not in result.output["message"]
    assert not WorkflowInstance.objects.filter(parent_instance_id=result.instance_id).exists()
    sv.replay_instance(result.instance_id)


def test_a_child_input_holding_nul_is_refused_on_every_database(small_limit: Worker) -> None:
    # PostgreSQL's jsonb cannot store NUL: the child start must be refused before the
    # insert, or the parent's fenced transaction fails and the parent retries forever.
    result = run("child_nul", 0)
    assert result.status == "completed", result.error
    assert result.output["error"] == "WorkflowStartRejected"
    assert "NUL" in result.output["message"]
    assert not WorkflowInstance.objects.filter(parent_instance_id=result.instance_id).exists()
    sv.replay_instance(result.instance_id)


def test_an_activity_error_stays_bounded_whatever_its_message_and_details(
    small_limit: Worker,
) -> None:
    result = run("activity_error", 10 * LIMIT)
    assert result.status == "completed", result.error
    assert result.output["error"] == "ApplicationError"
    for row in HistoryEvent.objects.filter(instance_id=result.instance_id):
        assert len(row.data or "") < 4 * LIMIT, row.key
    task = ActivityTask.objects.get(instance_id=result.instance_id, name="fault.sized")
    assert len(task.last_error or "") < 4 * LIMIT
    last = sv.list_activity_tasks(result.instance_id)[0].last_error
    assert isinstance(last, sv.ApplicationError) and last.type == "Huge"


# -- history length ---------------------------------------------------------------------


def test_an_execution_loading_more_events_than_the_threshold_logs_a_warning(
    tdb: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="selvedge_django")

    def run_flow(threshold: int) -> str:
        with Worker(history_warning_threshold=threshold, activity_queues=[""]):
            iid = sv.start_workflow("fault.flow", {"tag": f"h{threshold}"})
            sv.signal(iid, "go", 1)
            sv.signal(iid, "go", 2)
            assert sv.wait_workflow(iid, timeout=30).status == "completed"
        return iid

    quiet = run_flow(1000)
    assert not [r for r in caplog.records if "history events" in r.getMessage()]
    loud = run_flow(5)
    warnings = [r for r in caplog.records if "history events" in r.getMessage()]
    assert warnings
    events = HistoryEvent.objects.filter(instance_id=loud).count()
    for record in warnings:
        assert record.levelno == logging.WARNING
        assert record.instance_id == loud  # type: ignore[attr-defined]
        loaded = int(record.getMessage().split(" has ")[1].split()[0])
        assert 5 < loaded <= events
    assert "(threshold 5)" in warnings[0].getMessage()
    assert quiet != loud


# -- nesting depth and malformed values --------------------------------------------------


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep: ``[[...[0]...]]``."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [101, 5000], ids=["over-the-cap", "past-the-recursion-limit"])
def test_a_deeply_nested_start_input_is_rejected_with_nothing_written(
    tdb: None, depth: int
) -> None:
    with pytest.raises(sv.WorkflowStartRejected, match="nested"):
        sv.start_workflow("fault.limits", nested(depth), instance_id="deep")
    assert not WorkflowInstance.objects.exists()


@pytest.mark.parametrize("depth", [101, 5000], ids=["over-the-cap", "past-the-recursion-limit"])
def test_a_deeply_nested_signal_payload_is_invalid_with_nothing_written(
    tdb: None, depth: int
) -> None:
    iid = sv.start_workflow("fault.limits", {"mode": "signal", "size": 0})
    with pytest.raises(sv.InvalidSignalPayload, match="nested"):
        sv.signal(iid, "big", nested(depth))
    assert not SignalMessage.objects.exists()


def test_a_value_nested_exactly_to_the_cap_is_accepted_and_round_trips(tdb: None) -> None:
    from selvedge_django.engine.codec import MAX_NESTING_DEPTH

    value = {"k": nested(MAX_NESTING_DEPTH - 1), "s": "[[[[" * 200}  # brackets in text count not
    iid = sv.start_workflow("fault.limits", value, instance_id="at-cap")
    assert WorkflowInstance.objects.get(instance_id=iid).input == value


def test_a_deeply_nested_activity_result_is_a_final_failure_the_workflow_handles(
    worker: Worker,
) -> None:
    iid = sv.start_workflow("fault.deep_result", 5000)
    result = sv.wait_workflow(iid, timeout=30)
    assert result.status == "completed", result.error
    assert result.output["error"] == "PayloadTooDeep"
    task = ActivityTask.objects.get(instance_id=iid)
    assert (task.status, task.attempts) == ("failed", 1)


@pytest.mark.parametrize(
    "path",
    [".".join(["a"] * 600), "customer\n", "customer.\n", "a" * 300],
    ids=["600-segments", "trailing-newline", "dot-newline", "300-characters"],
)
def test_a_hostile_input_filter_path_is_a_value_error(tdb: None, path: str) -> None:
    with pytest.raises(ValueError, match="input filter path"):
        sv.find_instances(input_filters={path: 1})


@pytest.mark.parametrize(
    "envelope",
    [
        {"kind": "engine", "type": "RetryExhaustedError", "fields": "corrupt"},
        {"kind": "engine", "type": "ActivityTimeoutError", "fields": {"attempt": "x"}},
        {"kind": "engine", "type": "RetryExhaustedError", "fields": {"last_error": [1]}},
        {"kind": "application", "type": ["not", "text"], "message": "m"},
    ],
    ids=["fields-not-an-object", "attempt-not-a-number", "last-error-not-an-object", "type"],
)
def test_a_corrupt_error_envelope_raises_replay_decode_error(envelope: dict[str, Any]) -> None:
    from selvedge_django.engine.events import HistoryRow
    from selvedge_django.engine.handles import decode_outcome

    row = HistoryRow("k", 1, "activity", "ActivityFailed", json.dumps(envelope))
    with pytest.raises(sv.ReplayDecodeError, match="error envelope"):
        decode_outcome(row)


def test_a_recorded_value_that_is_not_json_raises_replay_decode_error() -> None:
    from selvedge_django.engine.events import HistoryRow
    from selvedge_django.engine.handles import decode_outcome

    row = HistoryRow("k", 1, "activity", "ActivityCompleted", "{not json")
    with pytest.raises(sv.ReplayDecodeError):
        decode_outcome(row)


# -- history and inbox limits ------------------------------------------------------------


def limited(**changes: Any) -> Any:
    return override_settings(SELVEDGE={**settings.SELVEDGE, **changes})


def test_a_signal_over_the_pending_limit_is_refused_with_nothing_written(tdb: None) -> None:
    with limited(MAX_PENDING_SIGNALS=3):
        iid = sv.start_workflow("limits.inbox", 4)
        for n in range(3):
            sv.signal(iid, "go", n)
        with pytest.raises(sv.InboxFull, match="MAX_PENDING_SIGNALS") as caught:
            sv.signal(iid, "go", 3)
        assert caught.value.instance_id == iid
        assert SignalMessage.objects.filter(instance_id=iid).count() == 3
        # The refusal rolls back only the signal, not the caller's own transaction.
        from django.db import transaction

        with transaction.atomic():
            Ledger.objects.create(entry="caller")
            with pytest.raises(sv.InboxFull):
                sv.signal(iid, "go", 3)
        assert Ledger.objects.filter(entry="caller").exists()
        assert SignalMessage.objects.filter(instance_id=iid).count() == 3
        # Consumed signals leave the inbox: there is room again.
        with Worker():
            wait_until_consumed = 3
            from tests.conftest import wait_until

            wait_until(
                lambda: (
                    SignalMessage.objects.filter(
                        instance_id=iid, consumed_seq__isnull=False
                    ).count()
                    == wait_until_consumed
                )
            )
            sv.signal(iid, "go", 3)
            assert sv.wait_workflow(iid, timeout=30).output == [0, 1, 2, 3]


def test_an_instance_over_the_event_limit_fails_once_with_a_typed_error(tdb: None) -> None:
    with limited(MAX_HISTORY_EVENTS=20), Worker():
        iid = sv.start_workflow("limits.grow", {"steps": 1000})
        result = sv.wait_workflow(iid, timeout=30)
    assert result.status == "failed"
    assert isinstance(result.error, sv.HistoryLimitExceeded)
    assert (result.error.instance_id, result.error.limit) == (iid, "MAX_HISTORY_EVENTS")
    assert "MAX_HISTORY_EVENTS" in str(result.error)
    # 20 commands and the close: nothing past the limit was recorded.
    assert HistoryEvent.objects.filter(instance_id=iid).count() == 21
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert (inst.status, inst.runnable) == ("failed", False)


def test_an_instance_over_the_byte_limit_fails_with_a_typed_error(tdb: None) -> None:
    with limited(MAX_HISTORY_BYTES=10_000), Worker():
        iid = sv.start_workflow("limits.grow", {"steps": 100, "size": 1000})
        result = sv.wait_workflow(iid, timeout=30)
    assert result.status == "failed"
    assert isinstance(result.error, sv.HistoryLimitExceeded)
    assert result.error.limit == "MAX_HISTORY_BYTES"
    rows = HistoryEvent.objects.filter(instance_id=iid)
    assert 10 <= rows.count() <= 12
    assert sum(len((r.data or "").encode()) for r in rows) < 10_000 + 2 * 1100
    assert ActivityTask.objects.filter(instance_id=iid).count() == rows.count() - 1


def test_a_resumption_loads_at_most_the_event_limit_and_fails_an_oversized_instance(
    tdb: None,
) -> None:
    with Worker():
        iid = sv.start_workflow("limits.inbox", 100)
        for n in range(30):
            sv.signal(iid, "go", n)
        from tests.conftest import wait_until

        wait_until(lambda: HistoryEvent.objects.filter(instance_id=iid).count() == 30)
    from selvedge_django.operations import _store

    assert len(_store().instances.load_snapshot(iid, max_events=10).history) == 11
    # The limit is lowered below what the instance holds: its next resumption fails it.
    with limited(MAX_HISTORY_EVENTS=10), Worker():
        try:
            sv.signal(iid, "go", 30)
        except sv.WorkflowAlreadyFailed:
            pass  # the instance was still runnable: the new worker got to it first
        result = sv.wait_workflow(iid, timeout=30)
    assert result.status == "failed"
    assert isinstance(result.error, sv.HistoryLimitExceeded)
    assert HistoryEvent.objects.filter(instance_id=iid).count() == 31  # 30 receives, the close


def test_an_export_over_the_event_limit_is_refused(tdb: None) -> None:
    with Worker():
        iid = sv.start_workflow("limits.grow", {"steps": 30})
        assert sv.wait_workflow(iid, timeout=30).status == "completed"
    assert len(sv.export_history(iid).events) == 31
    with limited(MAX_HISTORY_EVENTS=10), pytest.raises(sv.HistoryLimitExceeded):
        sv.export_history(iid)


@pytest.mark.parametrize(
    ("key", "value"),
    [("MAX_HISTORY_EVENTS", 0), ("MAX_PENDING_SIGNALS", -1), ("MAX_HISTORY_BYTES", 1.5)],
)
def test_the_limits_are_positive_integers(key: str, value: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from selvedge_django.conf import resolve_settings

    with pytest.raises(ImproperlyConfigured, match=key):
        resolve_settings({key: value})


@pytest.mark.slow
def test_wait_condition_delivers_more_arrivals_than_a_statement_takes_parameters(
    tdb: None,
) -> None:
    # 100,000 signals arrive before the instance first runs; one predicate sees them all,
    # so one delivery batch marks them all. PostgreSQL binds at most 65,535 parameters
    # per statement (with server-side binding) and SQLite 250,000 (Debian's build):
    # the batch must never bind them all in one statement.
    from django.db import connection

    from selvedge_django.testing import run_until_idle

    count = 100_000
    with limited(MAX_PENDING_SIGNALS=count):
        iid = sv.start_workflow("limits.wait_many", count)
        SignalMessage.objects.bulk_create(
            [SignalMessage(instance_id=iid, channel="many", payload="0") for _ in range(count)],
            batch_size=5000,
        )
        widest = 0

        def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal widest
            widest = max(widest, len(params or ()))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(spy):
            run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert (result.status, result.output) == ("completed", count), result.error
    assert not SignalMessage.objects.filter(instance_id=iid, delivered_seq__isnull=True).exists()
    assert widest <= 10_000


@pytest.fixture
def widest_statement(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Statements bind at most 8 values per IN list; yields [most parameters seen]."""
    from django.db import connection

    from selvedge_django.storage.db import Database

    monkeypatch.setattr(Database, "DELIVERY_CHUNK", 8)
    widest = [0]

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # (Dispatch lists the registered workflow names, claims the registered activity
        # names: bounded by the code, and growing with every activity a test registers.)
        if "workflow_name IN" not in sql and '"name" IN' not in sql and "n (name)" not in sql:
            widest[0] = max(widest[0], len(params or ()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        yield widest


def test_cancelling_many_tasks_and_children_binds_bounded_lists(
    tdb: None, widest_statement: list[int]
) -> None:
    # A scope cancel of 60 tasks and 60 children, then a close leaving 60 children
    # running: each used to be one IN list of every key or child id (120 parameters and
    # more here, past any driver's limit at 65,536 children).
    from selvedge_django.testing import run_until_idle

    n = 60
    iid = sv.start_workflow("limits.cancel_many", {"tasks": n, "children": n, "orphans": n})
    run_until_idle(Worker(activity_queues=[""], run_local_starts=False))
    assert sv.get_workflow_result(iid).output == 3 * n
    tasks = ActivityTask.objects.filter(instance_id=iid)
    assert tasks.count() == n and set(tasks.values_list("status", flat=True)) == {"cancelled"}
    children = WorkflowInstance.objects.filter(parent_instance_id=iid)
    assert children.count() == 2 * n
    assert set(children.values_list("status", flat=True)) == {"cancelled"}
    # A reservation binds up to 43 values (PostgreSQL's one statement); no IN list binds
    # more than 8.
    assert widest_statement[0] <= 60


def test_a_read_first_delivery_binds_bounded_lists(tdb: None, widest_statement: list[int]) -> None:
    # The delivery path of databases without UPDATE ... RETURNING (SQLite before 3.35).
    from django.db import connection

    from selvedge_django.engine.codec import Codec
    from selvedge_django.engine.events import Arrivals
    from selvedge_django.engine.ports import Observation
    from selvedge_django.storage import store_for

    iid = sv.start_workflow("limits.wait_many", 50)
    rows = [
        HistoryEvent(
            instance_id=iid,
            key=f"k{n}",
            seq=n + 1,
            command="activity",
            event_type="ActivityCompleted",
            data="1",
        )
        for n in range(50)
    ]
    HistoryEvent.objects.bulk_create(rows)
    SignalMessage.objects.bulk_create(
        [SignalMessage(instance_id=iid, channel="many", payload="0") for _ in range(50)]
    )
    signals = tuple(SignalMessage.objects.filter(instance_id=iid).values_list("id", "channel"))
    wanted = Arrivals(keys=tuple(f"k{n}" for n in range(0, 50, 2)), signals=signals[::2])
    store = store_for(connection.alias, Codec())
    widest_statement[0] = 0  # (the bulk inserts above bind more)
    with store.atomic():
        delivered = store.waits._deliver_read_first(iid, 99, Observation(99, deliver=wanted))
    assert delivered == wanted
    assert HistoryEvent.objects.filter(instance_id=iid, delivered_seq=99).count() == 25
    assert SignalMessage.objects.filter(instance_id=iid, delivered_seq=99).count() == 25
    assert widest_statement[0] <= 20
