"""Traces that follow the work: the caller's span is carried into the instance.

``start_workflow``, ``signal`` and ``cancel_workflow`` store the W3C trace context
of a span made under the caller's current span; every span of the run's work is
its child, whichever worker does it and however often the run suspends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import selvedge_django as sv
from selvedge_django.contrib.otel import OpenTelemetryHooks
from selvedge_django.hooks import HookEvent, WorkflowHooks
from selvedge_django.models import SignalMessage, WorkflowInstance
from selvedge_django.operations.task_records import database_now_ms
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows

ORDER = {"sku": "tea", "quantity": 2}


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def traced(tdb: None) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks = OpenTelemetryHooks(tracer_provider=provider)
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": hooks}):
        yield provider, exporter


def of(spans: Any, instance_id: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get("selvedge.instance_id") == instance_id]


def test_a_run_is_one_trace_under_the_span_that_started_it(
    clock: ControllableClock, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    worker = Worker(worker_id="tracing-worker")
    with tracer.start_as_current_span("POST /orders/") as request:
        sv.start_workflow(ops_workflows.order, ORDER, instance_id="order-1")
    run_until_idle(worker)
    with tracer.start_as_current_span("POST /orders/order-1/approve/") as approval:
        sv.signal("order-1", "approve", {"by": "ada"})
    run_until_idle(worker)
    clock.advance(61)
    run_until_idle(worker)
    assert sv.describe("order-1").status == "completed"

    finished = exporter.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    (start,) = [s for s in of(finished, "order-1") if s.name == "selvedge.workflow.start"]
    assert start.parent is not None and start.parent.span_id == request.get_span_context().span_id
    stored = json.loads(WorkflowInstance.objects.get(pk="order-1").trace_context)
    assert stored["traceparent"].startswith(f"00-{trace_id:032x}-{start.context.span_id:016x}-")

    work = [s for s in of(finished, "order-1") if s.name not in ("selvedge.workflow.start",)]
    sends = [s for s in work if s.name == "selvedge.signal.send"]
    assert len(sends) == 1 and sends[0].parent.span_id == approval.get_span_context().span_id
    # The send belongs to the approving request's trace; the work to the run's.
    assert sends[0].context.trace_id == approval.get_span_context().trace_id
    for span in work:
        if span.name != "selvedge.signal.send":
            assert span.context.trace_id == trace_id, span.name
            assert span.parent.span_id == start.context.span_id, span.name
    assert {s.name for s in work} >= {
        "selvedge.workflow.execute",
        "selvedge.activity.attempt",
        "selvedge.timer.fire",
        "selvedge.signal.receive",
    }
    (receive,) = [s for s in work if s.name == "selvedge.signal.receive"]
    assert [link.context.span_id for link in receive.links] == [sends[0].context.span_id]
    assert SignalMessage.objects.get(instance_id="order-1").trace_context is not None

    # The receipt child joins its parent's trace, under the parent's start span.
    (child_id,) = WorkflowInstance.objects.filter(parent_instance_id="order-1").values_list(
        "instance_id", flat=True
    )
    child = of(finished, child_id)
    assert child and {s.context.trace_id for s in child} == {trace_id}
    assert {s.parent.span_id for s in child if s.parent} == {start.context.span_id}


def test_a_cancelled_execution_links_to_the_cancel_request(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    worker = Worker()
    iid = sv.start_workflow(ops_workflows.wait)  # no span current: the start span is a root
    run_until_idle(worker)
    with tracer.start_as_current_span("admin cancel") as admin:
        sv.cancel_workflow(iid, "changed my mind")
    run_until_idle(worker)
    assert sv.describe(iid).status == "cancelled"

    spans = of(exporter.get_finished_spans(), iid)
    (start,) = [s for s in spans if s.name == "selvedge.workflow.start"]
    (request,) = [s for s in spans if s.name == "selvedge.workflow.cancel"]
    assert start.parent is None
    assert request.parent.span_id == admin.get_span_context().span_id
    assert [link.context.span_id for link in request.links] == [start.context.span_id]
    (cancelled,) = [s for s in spans if s.attributes.get("selvedge.outcome") == "cancelled"]
    assert cancelled.parent.span_id == start.context.span_id
    assert [link.context.span_id for link in cancelled.links] == [request.context.span_id]


def test_a_fork_is_a_trace_of_its_own_under_the_operators_span_linked_to_its_source(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    worker = Worker()
    source = sv.start_workflow(ops_workflows.echo, "hello")
    run_until_idle(worker)
    with tracer.start_as_current_span("admin fork") as admin:
        fork = sv.fork_workflow(source)
    run_until_idle(worker)
    assert sv.describe(fork).status == "completed"

    finished = exporter.get_finished_spans()
    (source_start,) = [s for s in of(finished, source) if s.name == "selvedge.workflow.start"]
    spans = of(finished, fork)
    (forked,) = [s for s in spans if s.name == "selvedge.workflow.fork"]
    assert forked.parent.span_id == admin.get_span_context().span_id
    assert forked.attributes["selvedge.forked_from"] == source
    assert [link.context.span_id for link in forked.links] == [source_start.context.span_id]
    work = [s for s in spans if s is not forked]
    assert {s.name for s in work} >= {"selvedge.workflow.execute"}
    for span in work:
        assert span.parent.span_id == forked.context.span_id, span.name
    stored = json.loads(WorkflowInstance.objects.get(pk=fork).trace_context)
    assert stored["traceparent"].split("-")[2] == f"{forked.context.span_id:016x}"


def test_a_resumed_run_stays_in_its_trace_and_the_resume_links_to_it(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    worker = Worker()
    iid = sv.start_workflow(ops_workflows.fail, "broken")
    run_until_idle(worker)
    assert sv.describe(iid).status == "failed"
    stored = WorkflowInstance.objects.get(pk=iid).trace_context
    with tracer.start_as_current_span("admin resume") as admin:
        sv.resume_workflow(iid)
    assert WorkflowInstance.objects.get(pk=iid).trace_context == stored
    run_until_idle(worker)

    spans = of(exporter.get_finished_spans(), iid)
    (start,) = [s for s in spans if s.name == "selvedge.workflow.start"]
    (resumed,) = [s for s in spans if s.name == "selvedge.workflow.resume"]
    assert resumed.parent.span_id == admin.get_span_context().span_id
    assert [link.context.span_id for link in resumed.links] == [start.context.span_id]
    executions = [s for s in spans if s.name == "selvedge.workflow.execute"]
    assert len(executions) == 2  # the first run and the resumed one, both under the start
    assert {s.parent.span_id for s in executions} == {start.context.span_id}


def test_each_scheduled_run_is_one_trace_under_its_fire_span(
    clock: ControllableClock, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    worker = Worker()
    sv.create_schedule("traced", ops_workflows.echo, interval=60, input="tick")
    # Just past the first slot: slots fall on the minutes of the database clock, so a
    # fixed 61 s from the last second of a minute would make two of them due.
    first = sv.describe_schedule("traced").next_run_at
    assert first is not None
    clock.advance(max(0.0, first.timestamp() - database_now_ms() / 1000) + 1)
    run_until_idle(worker)  # the leader starts the slot's run
    with tracer.start_as_current_span("admin trigger") as admin:
        triggered = sv.trigger_schedule("traced")
    run_until_idle(worker)
    runs = list(WorkflowInstance.objects.filter(workflow_name="ops.echo").order_by("started_at"))
    assert len(runs) == 2 and {r.status for r in runs} == {"completed"}
    (slot_run,) = [r.instance_id for r in runs if r.instance_id != triggered]

    finished = exporter.get_finished_spans()
    for run_id, parent in [(slot_run, None), (triggered, admin.get_span_context().span_id)]:
        spans = of(finished, run_id)
        (fire,) = [s for s in spans if s.name == "selvedge.schedule.fire"]
        assert fire.attributes["selvedge.schedule"] == "traced"
        assert (fire.parent.span_id if fire.parent else None) == parent
        assert not [s for s in spans if s.name == "selvedge.workflow.start"]  # no second root
        work = [s for s in spans if s is not fire]
        assert {s.name for s in work} >= {"selvedge.workflow.execute"}
        for span in work:
            assert span.parent.span_id == fire.context.span_id, span.name


class Hostile(WorkflowHooks):
    """Hooks whose trace_context returns whatever the test sets (or raises)."""

    def __init__(self, carrier: Any) -> None:
        self.carrier = carrier

    def trace_context(self, operation: str, event: HookEvent) -> Mapping[str, str] | None:
        if isinstance(self.carrier, Exception):
            raise self.carrier
        return self.carrier  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "carrier",
    [
        {"traceparent": "x" * 100_000},
        {"traceparent": "00-" + "0" * 31 + "-" + "1" * 16 + "-01"},
        ["not", "a", "mapping"],
        RuntimeError("tracing is down"),
        None,
    ],
    ids=["huge", "malformed", "not-a-mapping", "raises", "none"],
)
def test_a_bad_trace_context_is_not_stored_and_never_stops_the_work(
    tdb: None, carrier: Any
) -> None:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": Hostile(carrier)}):
        iid = sv.start_workflow(ops_workflows.wait)
        sv.signal(iid, "go", 1)
        run_until_idle(Worker())
    assert sv.describe(iid).status == "completed"
    assert WorkflowInstance.objects.get(pk=iid).trace_context is None
    assert SignalMessage.objects.get(instance_id=iid).trace_context is None


def test_a_valid_trace_context_is_stored_trimmed_to_the_w3c_fields(tdb: None) -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    carrier = {"traceparent": parent, "tracestate": "k=v", "baggage": "user=alice"}
    with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": Hostile(carrier)}):
        iid = sv.start_workflow(ops_workflows.wait)
    stored = WorkflowInstance.objects.get(pk=iid).trace_context
    assert json.loads(stored) == {"traceparent": parent, "tracestate": "k=v"}
