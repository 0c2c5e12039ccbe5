"""Lifecycle hooks, Django signals, OpenTelemetry spans and the replay-aware logger.

Each callback fires once, after the durable write it reports (the recorder reads
the database from inside the callback to prove it), and never while replaying,
querying or checking histories. Most tests step an unstarted ``Worker`` with
``run_until_idle`` on a controllable clock, so the order of callbacks is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import selvedge_django as sv
from selvedge_django import signals
from selvedge_django.conf import get_settings
from selvedge_django.contrib.otel import OpenTelemetryHooks
from selvedge_django.engine.execution import current_execution
from selvedge_django.hooks import HOOK_NAMES, HookEvent, WorkflowHooks
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows
from tests.conftest import wait_until

ORDER = {"sku": "tee", "quantity": 3}
LIFECYCLE = ("workflow_started", "workflow_completed", "workflow_failed", "workflow_cancelled")


class Recorder(WorkflowHooks):
    """Record each callback with what the database held when it fired."""

    def __init__(self) -> None:
        self.events: list[tuple[str, HookEvent, dict[str, Any]]] = []

    def seen(self, instance_id: str | None = None) -> list[str]:
        return [
            name.removeprefix("on_")
            for name, event, _ in self.events
            if instance_id is None or event.instance_id == instance_id
        ]

    def of(self, name: str) -> list[tuple[HookEvent, dict[str, Any]]]:
        return [(event, state) for n, event, state in self.events if n == "on_" + name]

    def _state(self, name: str, event: HookEvent) -> dict[str, Any]:
        inst = WorkflowInstance.objects.filter(instance_id=event.instance_id).first()
        state: dict[str, Any] = {
            "in_transaction": connection.in_atomic_block,
            "status": inst.status if inst else None,
            "lease_owner": inst.lease_owner if inst else None,
        }
        if event.key is not None:
            row = HistoryEvent.objects.filter(instance_id=event.instance_id, key=event.key).first()
            state["row_has_value"] = row is not None and row.data is not None
            task = ActivityTask.objects.filter(instance_id=event.instance_id, key=event.key)
            state["task_status"] = task.values_list("status", flat=True).first()
        if name == "on_signal_received":
            state["unconsumed"] = SignalMessage.objects.filter(
                instance_id=event.instance_id, consumed_seq__isnull=True
            ).count()
        if name == "on_timer_fired":
            state["timers"] = TimerSubscription.objects.filter(
                instance_id=event.instance_id
            ).count()
        return state

    def __getattribute__(self, name: str) -> Any:
        if name in HOOK_NAMES:

            def record(event: HookEvent) -> None:
                state = object.__getattribute__(self, "_state")(name, event)
                object.__getattribute__(self, "events").append((name, event, state))

            return record
        return object.__getattribute__(self, name)


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """A Recorder installed as the HOOKS setting (on top of the test settings)."""
    recorder = Recorder()
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": recorder}):
        yield recorder


@pytest.fixture
def sent() -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """Django lifecycle signals received: (signal name, sender, keyword arguments)."""
    received: list[tuple[str, Any, dict[str, Any]]] = []
    receivers = []
    for name in LIFECYCLE:

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal")
            received.append((name, sender, kwargs))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield received
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def drive_order(clock: ControllableClock, worker: Worker, instance_id: str) -> None:
    sv.start_workflow("ops.golden.order", ORDER, instance_id=instance_id)
    run_until_idle(worker)
    sv.signal(instance_id, "approve", {"by": "ada"})
    run_until_idle(worker)
    clock.advance(61)
    run_until_idle(worker)
    assert sv.describe(instance_id).status == "completed"


# -- once each, after the write --------------------------------------------------------------


def test_each_callback_fires_once_in_lifecycle_order(
    clock: ControllableClock, recorder: Recorder
) -> None:
    worker = Worker(worker_id="hooked-worker")
    drive_order(clock, worker, "hooked")
    assert recorder.seen("hooked") == [
        "workflow_started",
        "activity_started",
        "activity_completed",
        "workflow_suspended",  # waiting for approval
        "workflow_replayed",
        "activity_cache_hit",
        "signal_received",
        "workflow_suspended",  # sleeping
        "timer_fired",
        "workflow_replayed",
        "activity_cache_hit",
        "workflow_suspended",  # waiting for the receipt
        "workflow_replayed",
        "activity_cache_hit",
        "workflow_completed",
    ]
    (child,) = WorkflowInstance.objects.filter(parent_instance_id="hooked")
    assert recorder.seen(child.instance_id) == ["workflow_started", "workflow_completed"]

    for event, _ in recorder.of("activity_completed") + recorder.of("activity_cache_hit"):
        assert (event.key, event.activity_name) == ("#1:ops.golden.price", "ops.golden.price")
    ((started, _),) = recorder.of("activity_started")
    ((finished, _),) = recorder.of("activity_completed")
    assert started.attempt == finished.attempt == 1
    assert finished.duration is not None and finished.duration >= 0
    ((received, _),) = recorder.of("signal_received")
    assert received.key == "#3:receive:approve"
    ((fired, _),) = recorder.of("timer_fired")
    assert (fired.instance_id, fired.key) == ("hooked", "#4:sleep")
    assert fired.workflow_name == "ops.golden.order"
    for name, event, _ in recorder.events:
        assert event.workflow_name in ("ops.golden.order", "ops.golden.receipt"), name
        if name != "on_workflow_started" or event.instance_id == child.instance_id:
            assert event.worker_id == "hooked-worker", name


def test_a_background_attempts_completion_fires_no_close_of_its_own(
    clock: ControllableClock, recorder: Recorder, sent: list[tuple[str, Any, dict[str, Any]]]
) -> None:
    """An activity claimed by the poller (a concurrency limit keeps it off the inline
    path) records its result and wakes the workflow; the workflow's close is the one
    ``workflow_completed``, after the replay."""
    sv.start_workflow("flow.run", {"tag": "bg", "activity": "flow.serial"}, instance_id="bg")
    run_until_idle(Worker())
    assert sv.get_workflow_result("bg").output == "bg"
    assert recorder.seen("bg").count("workflow_completed") == 1
    assert recorder.seen("bg")[-1] == "workflow_completed"
    assert [name for name, _, kwargs in sent if kwargs["instance_id"] == "bg"] == [
        "workflow_started",
        "workflow_completed",
    ]


def test_callbacks_fire_after_the_durable_write_they_report(
    clock: ControllableClock, recorder: Recorder
) -> None:
    drive_order(clock, Worker(), "after-write")
    for name, _, state in recorder.events:
        assert state["in_transaction"] is False, name
    ((_, started),) = recorder.of("workflow_started")[:1]
    assert started["status"] == "running"
    for _, state in recorder.of("workflow_suspended"):
        assert state["lease_owner"] == ""  # released
    (completed,) = [
        s for e, s in recorder.of("workflow_completed") if e.instance_id == "after-write"
    ]
    assert completed["status"] == "completed"
    ((_, activity),) = recorder.of("activity_completed")
    assert activity["task_status"] == "completed" and activity["row_has_value"]
    ((_, received),) = recorder.of("signal_received")
    assert received["row_has_value"] and received["unconsumed"] == 0
    ((_, fired),) = recorder.of("timer_fired")
    assert fired["row_has_value"] and fired["timers"] == 0


def test_a_start_fires_only_after_its_transaction_commits(
    tdb: None, recorder: Recorder, sent: list[Any]
) -> None:
    with transaction.atomic():
        sv.start_workflow(ops_workflows.echo, 1, instance_id="committed")
        assert recorder.events == [] and sent == []
    assert recorder.seen() == ["workflow_started"]
    with pytest.raises(RuntimeError), transaction.atomic():
        sv.start_workflow(ops_workflows.echo, 1, instance_id="rolled-back")
        raise RuntimeError("roll back")
    assert recorder.seen() == ["workflow_started"]
    assert sent == [
        ("workflow_started", "ops.echo", {"instance_id": "committed", "workflow_name": "ops.echo"})
    ]


# -- Django signals ------------------------------------------------------------------------


def test_django_signals_for_each_way_to_close(
    clock: ControllableClock, sent: list[tuple[str, Any, dict[str, Any]]]
) -> None:
    worker = Worker()
    sv.start_workflow(ops_workflows.echo, "x", instance_id="s-completed")
    sv.start_workflow(ops_workflows.fail, "it broke", instance_id="s-failed")
    sv.start_workflow(ops_workflows.wait, instance_id="s-cancelled")
    run_until_idle(worker)
    sv.cancel_workflow("s-cancelled", "operator")
    run_until_idle(worker)
    by_instance: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {}
    for item in sent:
        by_instance.setdefault(item[2]["instance_id"], []).append(item)

    assert [name for name, _, _ in by_instance["s-completed"]] == [
        "workflow_started",
        "workflow_completed",
    ]
    _, sender, kwargs = by_instance["s-completed"][1]
    assert sender == "ops.echo" and kwargs["workflow_name"] == "ops.echo"
    assert kwargs.get("error") is None

    name, sender, kwargs = by_instance["s-failed"][1]
    assert (name, sender) == ("workflow_failed", "ops.fail")
    assert isinstance(kwargs["error"], sv.ApplicationError)
    assert kwargs["error"].message == "it broke"

    assert [name for name, _, _ in by_instance["s-cancelled"]] == [
        "workflow_started",
        "workflow_cancelled",
    ]
    error = by_instance["s-cancelled"][1][2]["error"]
    assert isinstance(error, sv.WorkflowCancelled) and error.reason == "operator"


def test_signals_and_hooks_fire_once_from_a_running_worker(
    make_worker: Any, recorder: Recorder, sent: list[Any]
) -> None:
    make_worker()
    iid = sv.start_workflow(ops_workflows.parent)
    wait_until(lambda: sv.describe(iid).status == "running" and recorder.of("workflow_suspended"))
    sv.signal(iid, "go", "now")
    assert sv.wait_workflow(iid, timeout=20).output == ["child value", "now"]
    wait_until(lambda: [e for e, _ in recorder.of("workflow_completed") if e.instance_id == iid])
    completed = [e.instance_id for e, _ in recorder.of("workflow_completed")]
    assert sorted(completed) == sorted([iid, f"{iid}/#1:child:ops.echo"])
    assert [s[0] for s in sent if s[2]["instance_id"] == iid] == [
        "workflow_started",
        "workflow_completed",
    ]
    assert len([e for e, _ in recorder.of("signal_received") if e.instance_id == iid]) == 1


def test_raising_hooks_and_receivers_are_logged_and_ignored(
    clock: ControllableClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(WorkflowHooks):
        def on_workflow_completed(self, event: HookEvent) -> None:
            raise RuntimeError("hook broke")

    def broken_receiver(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver broke")

    signals.workflow_completed.connect(broken_receiver, weak=False)
    try:
        iid = sv.start_workflow(ops_workflows.echo, 7)
        run_until_idle(Worker(hooks=Broken()))
    finally:
        signals.workflow_completed.disconnect(broken_receiver)
    assert sv.get_workflow_result(iid).output == 7
    messages = [r.getMessage() for r in caplog.records]
    assert "hook on_workflow_completed raised; ignored" in messages
    assert any("receiver broke" in m and "ignored" in m for m in messages)


# -- nothing without the write -----------------------------------------------------------------

_takeovers: list[str] = []


@sv.workflow(name="ops.hooks.fenced_at_close")
def fenced_at_close(ctx: sv.WorkflowContext, _: Any) -> str:
    """Another worker takes the lease over just before this execution closes."""
    WorkflowInstance.objects.filter(instance_id=ctx.instance_id).update(
        lease_epoch=F("lease_epoch") + 1
    )
    return "closed by nobody"


@sv.workflow(name="ops.hooks.belief_lost")
def belief_lost(ctx: sv.WorkflowContext, _: Any) -> str:
    """The first execution can no longer prove its lease when it is about to close."""
    execution = current_execution()
    assert execution is not None and execution.fence is not None
    if ctx.instance_id not in _takeovers:
        _takeovers.append(ctx.instance_id)
        execution.runtime.drop(execution.fence)  # type: ignore[attr-defined]
    return "closed by the second execution"


def test_no_close_hook_when_the_close_is_fenced_out(
    clock: ControllableClock, recorder: Recorder, sent: list[Any]
) -> None:
    iid = sv.start_workflow(fenced_at_close)
    run_until_idle(Worker())
    assert sv.describe(iid).status == "running"  # the close was refused
    assert recorder.seen(iid) == ["workflow_started"]
    assert [s[0] for s in sent] == ["workflow_started"]


def test_no_close_hook_when_the_lease_can_no_longer_be_proven(
    clock: ControllableClock, recorder: Recorder, sent: list[Any]
) -> None:
    iid = sv.start_workflow(belief_lost)
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == "closed by the second execution"
    assert recorder.seen(iid) == ["workflow_started", "workflow_completed"]
    assert [s[0] for s in sent] == ["workflow_started", "workflow_completed"]


# -- never during replay checks or queries -------------------------------------------------------


def test_no_callbacks_or_signals_while_checking_histories_or_answering_queries(
    clock: ControllableClock, recorder: Recorder, sent: list[Any]
) -> None:
    drive_order(clock, Worker(), "quiet")
    running = sv.start_workflow("ops.golden.order", ORDER)
    run_until_idle(Worker())
    before_hooks, before_signals = len(recorder.events), len(sent)
    with override_settings(SELVEDGE={"HOOKS": recorder}):
        assert get_settings().hooks is recorder
        for iid in ("quiet", running):
            sv.replay_instance(iid)
            sv.replay_history(sv.parse_history(sv.export_history(iid).to_json()))
            sv.query(iid, "stage")
    assert (len(recorder.events), len(sent)) == (before_hooks, before_signals)


# -- OpenTelemetry --------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """OpenTelemetryHooks on an in-memory exporter, installed as the HOOKS setting."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks = OpenTelemetryHooks(tracer_provider=provider)
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": hooks}):
        yield exporter


def test_opentelemetry_spans_for_the_lifecycle(
    clock: ControllableClock, spans: InMemorySpanExporter
) -> None:
    drive_order(clock, Worker(worker_id="otel-worker"), "traced")
    finished = spans.get_finished_spans()
    mine = [s for s in finished if s.attributes["selvedge.instance_id"] == "traced"]
    assert [s.name for s in mine] == [
        "selvedge.workflow.start",
        "selvedge.activity.attempt",
        "selvedge.workflow.execute",  # suspended, waiting for approval
        "selvedge.signal.send",
        "selvedge.workflow.replay",
        "selvedge.activity.cache_hit",
        "selvedge.signal.receive",
        "selvedge.workflow.execute",  # suspended, sleeping
        "selvedge.timer.fire",
        "selvedge.workflow.replay",
        "selvedge.activity.cache_hit",
        "selvedge.workflow.execute",  # suspended, waiting for the receipt
        "selvedge.workflow.replay",
        "selvedge.activity.cache_hit",
        "selvedge.workflow.execute",  # completed
    ]
    by_name = {s.name: s for s in mine}
    activity = by_name["selvedge.activity.attempt"]
    assert dict(activity.attributes) == {
        "selvedge.instance_id": "traced",
        "selvedge.workflow_name": "ops.golden.order",
        "selvedge.key": "#1:ops.golden.price",
        "selvedge.activity_name": "ops.golden.price",
        "selvedge.attempt": 1,
        "selvedge.worker_id": "otel-worker",
        "selvedge.outcome": "completed",
    }
    assert activity.end_time > activity.start_time  # spans the attempt's duration
    executions = [s for s in mine if s.name == "selvedge.workflow.execute"]
    assert [s.attributes["selvedge.outcome"] for s in executions] == [
        "suspended",
        "suspended",
        "suspended",
        "completed",
    ]
    assert all(s.end_time > s.start_time for s in executions)
    assert by_name["selvedge.activity.cache_hit"].start_time == (
        by_name["selvedge.activity.cache_hit"].end_time
    )
    assert by_name["selvedge.timer.fire"].attributes["selvedge.key"] == "#4:sleep"
    assert all(s.status.status_code is StatusCode.UNSET for s in mine)
    # One trace: every span of the run is a child of the start span (the signal's send
    # is a root here, as signal() was called with no span current; the delivery links it).
    start = by_name["selvedge.workflow.start"]
    send = by_name["selvedge.signal.send"]
    assert start.parent is None
    for span in mine:
        if span not in (start, send):
            assert span.parent is not None and span.parent.span_id == start.context.span_id
            assert span.context.trace_id == start.context.trace_id
    (link,) = by_name["selvedge.signal.receive"].links
    assert link.context.span_id == send.context.span_id
    assert by_name["selvedge.signal.receive"].attributes["messaging.operation.type"] == "process"
    assert send.attributes["messaging.destination.name"] == "approve"


def test_opentelemetry_marks_failures_as_errors(
    clock: ControllableClock, spans: InMemorySpanExporter
) -> None:
    iid = sv.start_workflow(ops_workflows.fail, "it broke")
    run_until_idle(Worker())
    (failed,) = [
        s for s in spans.get_finished_spans() if s.attributes.get("selvedge.outcome") == "failed"
    ]
    assert failed.attributes["selvedge.instance_id"] == iid
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "it broke"
    assert failed.attributes["error.type"] == "ApplicationError"
    (exception,) = failed.events
    assert exception.name == "exception"
    assert exception.attributes["exception.message"] == "it broke"


def test_opentelemetry_hooks_from_the_hooks_setting(tdb: None) -> None:
    with override_settings(SELVEDGE={"HOOKS": "selvedge_django.contrib.otel.OpenTelemetryHooks"}):
        hooks = get_settings().hooks
        assert isinstance(hooks, OpenTelemetryHooks)
        hooks.on_workflow_started(HookEvent("no-provider-configured", "ops.echo"))  # a no-op


# -- the replay-aware workflow logger ----------------------------------------------------------


@sv.workflow(name="ops.hooks.logging")
def logging_flow(ctx: sv.WorkflowContext, _: Any) -> str:
    ctx.set_query_handler("log", lambda: ctx.logger.info("from a query handler") or "answered")
    ctx.logger.info("before the activity")
    ops_workflows.price.execute(ctx, {"sku": "a", "quantity": 1})
    ctx.logger.info("between %s", "steps", extra={"step": 2})
    ctx.sleep(10)
    ctx.logger.warning("after the sleep")
    return "logged"


def test_the_workflow_logger_is_silent_while_replaying(
    clock: ControllableClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="selvedge_django.workflow")
    worker = Worker()
    iid = sv.start_workflow(logging_flow, instance_id="logged")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "selvedge_django.workflow"]

    run_until_idle(worker)
    assert lines() == ["before the activity", "between steps"]
    record = next(r for r in caplog.records if r.getMessage() == "between steps")
    assert (record.instance_id, record.workflow_name, record.step) == (  # type: ignore[attr-defined]
        "logged",
        "ops.hooks.logging",
        2,
    )
    clock.advance(11)
    run_until_idle(worker)  # replays the first two lines silently
    assert lines() == ["before the activity", "between steps", "after the sleep"]
    assert sv.get_workflow_result(iid).output == "logged"

    assert sv.query(iid, "log") == "answered"
    sv.replay_instance(iid)
    assert lines() == ["before the activity", "between steps", "after the sleep"]


def _failing_spans(hooks: OpenTelemetryHooks, exporter: InMemorySpanExporter, message: str) -> Any:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": hooks}):
        iid = sv.start_workflow(
            ops_workflows.fail, message, instance_id="order-of-alice@example.com"
        )
        run_until_idle(Worker())
    return iid, exporter.get_finished_spans()


def _exporting(**options: Any) -> tuple[OpenTelemetryHooks, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryHooks(tracer_provider=provider, **options), exporter


def test_opentelemetry_can_leave_exceptions_out_of_spans(clock: ControllableClock) -> None:
    hooks, exporter = _exporting(record_exception=False)
    _, finished = _failing_spans(hooks, exporter, "card 4111-1111-1111-1111 declined")
    (failed,) = [s for s in finished if s.attributes.get("selvedge.outcome") == "failed"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.events == ()  # no exception event: no message, no traceback
    assert "4111" not in (failed.status.description or "")
    assert failed.status.description == "ApplicationError"


def test_opentelemetry_scrubs_every_text_it_exports(clock: ControllableClock) -> None:
    seen: set[str] = set()

    def scrub(name: str, value: str) -> str:
        seen.add(name)
        return value.replace("alice@example.com", "[email]").replace("4111", "[card]")

    hooks, exporter = _exporting(scrub=scrub)
    _, finished = _failing_spans(hooks, exporter, "card 4111 of alice@example.com declined")
    texts: list[str] = []
    for span in finished:
        texts += [str(v) for v in span.attributes.values()]
        texts.append(span.status.description or "")
        for event in span.events:
            texts += [str(v) for v in event.attributes.values()]
    assert not [t for t in texts if "alice@example.com" in t or "4111" in t]
    assert "order-of-[email]" in texts
    assert {"selvedge.instance_id", "exception.message", "exception.stacktrace"} <= seen
    (failed,) = [s for s in finished if s.attributes.get("selvedge.outcome") == "failed"]
    assert failed.status.description == "card [card] of [email] declined"


def test_a_receiver_connected_for_one_workflow_name_gets_that_workflows_signals(
    tdb: None,
) -> None:
    """``connect(receiver, sender="<workflow name>")``, the way the docs say the sender is
    the workflow name: any equal string selects the workflow, as a user would write it
    (Django itself matches senders by identity, and the name a close reads from the
    database is another string object than the one in the user's module)."""
    got: list[tuple[str, str]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append((kwargs["signal"] is signals.workflow_completed and "completed", sender))

    name = "".join(["test.", "sum3"])  # equal to the registered name, not the same object
    signals.workflow_completed.connect(receiver, sender=name, weak=False)
    signals.workflow_failed.connect(receiver, sender="".join(["test.", "sum3"]), weak=False)
    try:
        done = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
        other = sv.start_workflow(ops_workflows.echo, 7)
        run_until_idle(Worker())
        assert sv.describe(done).status == sv.describe(other).status == "completed"
    finally:
        signals.workflow_completed.disconnect(receiver, sender=name)
        signals.workflow_failed.disconnect(receiver, sender="".join(["test.", "sum3"]))
    assert got == [("completed", "test.sum3")]
