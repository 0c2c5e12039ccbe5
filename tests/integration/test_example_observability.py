"""The example shop under the OpenTelemetry SDK: one trace per order, and its metrics.

A script runs the shop (``example_project/``, its own settings and SQLite file)
with the SDK's in-memory span exporter and in-memory metric reader: a customer's
request places an order, a worker in the script runs it to the wait for payment
approval (a suspension), a clerk's request approves it, and a real
``runselvedge worker`` process, exporting its spans to a file, runs the rest.
The test then checks the span tree across the request, the suspension and the
other process, and the metric points an operator's Prometheus would scrape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    os.environ.get("SELVEDGE_TEST_DB", "sqlite") != "sqlite",
    reason="the example project runs on its own SQLite file: the SQLite run covers it",
)

SCRIPT = """
import json, os, signal, subprocess, sys, time
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
import selvedge_django as sv
from selvedge_django.contrib.otel import OpenTelemetryHooks
from selvedge_django.models import WorkflowInstance
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from shop.models import Order, Product

exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
reader = InMemoryMetricReader()
meter_provider = MeterProvider(metric_readers=[reader])
tracer = tracer_provider.get_tracer("django")  # stands in for the Django instrumentation
out = {}

def span_dict(span):
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "attributes": dict(span.attributes or {}),
        "links": [f"{link.context.span_id:016x}" for link in span.links],
    }

def metric_points():
    found = []
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found.append({
                        "name": metric.name,
                        "attributes": dict(point.attributes),
                        "value": getattr(point, "count", getattr(point, "value", None)),
                    })
    return found

hooks = OpenTelemetryHooks(tracer_provider=tracer_provider)
with override_settings(SELVEDGE={**settings.SELVEDGE, "HOOKS": hooks, "METRICS": meter_provider}):
    alice = User.objects.create_user("alice", password="pw-alice-1")
    clerk = User.objects.create_user("clerk", password="pw-clerk-1", is_staff=True)
    customer, staff = Client(), Client()
    customer.force_login(alice)
    staff.force_login(clerk)
    mug = Product.objects.get(sku="mug")

    with tracer.start_as_current_span("POST /orders/", kind=SpanKind.SERVER) as request:
        placed = customer.post(
            "/orders/",
            {"product": mug.pk, "quantity": 1, "customer_email": "a@example.com", "card": "ok"},
        )
    out["placed"] = placed.status_code
    out["request"] = {
        "trace_id": f"{request.get_span_context().trace_id:032x}",
        "span_id": f"{request.get_span_context().span_id:016x}",
    }
    order = Order.objects.get()
    iid = order.instance_id
    out["instance_id"] = iid

    worker = Worker(worker_id="web-worker")
    run_until_idle(worker)  # reserves the stock, then waits for the approval: suspended
    out["status_before_approval"] = sv.describe(iid).status

    with tracer.start_as_current_span("POST /orders/approve/", kind=SpanKind.SERVER) as approve:
        approved = staff.post(f"/orders/{order.pk}/approve/")
    out["approved"] = approved.status_code
    out["approve_request"] = f"{approve.get_span_context().span_id:016x}"

    worker.leader.run_once()  # this process leads: it observes the gauges
    out["metrics_before_worker"] = metric_points()
    worker.leader.resign()

    out["trace_context"] = json.loads(WorkflowInstance.objects.get(pk=iid).trace_context)

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.example_otel_settings")
    proc = subprocess.Popen(
        [sys.executable, sys.argv[1], "runselvedge", "worker", "--worker-id", "shop-worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        result = sv.wait_workflow(iid, timeout=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    out["worker_exit"] = proc.returncode
    out["worker_stderr"] = err[-2000:]
    out["status"] = result.status
    out["spans"] = [span_dict(span) for span in exporter.get_finished_spans()]
    out["metrics"] = metric_points()
print(json.dumps(out))
"""


def run_shop(tmp_path: Path) -> dict[str, Any]:
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=os.pathsep.join([str(ROOT / "example_project"), str(ROOT)]),
        DATABASE_URL=f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        DEBUG="1",
        ALLOWED_HOSTS="testserver",
        SHOP_PACKING_SECONDS="0",
        SPANS_FILE=str(spans_file),
    )
    manage = str(ROOT / "example_project" / "manage.py")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), manage],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["worker_spans"] = [
        _file_span(json.loads(line))
        for line in spans_file.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return out


def _file_span(raw: dict[str, Any]) -> dict[str, Any]:
    """A span as the SDK's JSON has it, in the shape of the script's."""
    return {
        "name": raw["name"],
        "trace_id": raw["context"]["trace_id"].removeprefix("0x"),
        "span_id": raw["context"]["span_id"].removeprefix("0x"),
        "parent_id": (raw.get("parent_id") or "").removeprefix("0x") or None,
        "attributes": raw.get("attributes") or {},
        "links": [link["context"]["span_id"].removeprefix("0x") for link in raw.get("links", [])],
    }


def value(points: list[dict[str, Any]], name: str, **attributes: Any) -> Any:
    wanted = {f"selvedge.{k}": v for k, v in attributes.items()}
    for point in points:
        if point["name"] == name and point["attributes"] == wanted:
            return point["value"]
    return None


def test_an_order_is_one_trace_from_the_request_across_a_suspension_and_a_worker_process(
    tmp_path: Path,
) -> None:
    out = run_shop(tmp_path)
    assert (out["placed"], out["approved"]) == (302, 302)
    assert out["status_before_approval"] == "running"
    assert out["status"] == "completed", out["worker_stderr"]
    assert out["worker_exit"] == 0, out["worker_stderr"]
    iid, trace_id = out["instance_id"], out["request"]["trace_id"]

    here = [s for s in out["spans"] if s["attributes"].get("selvedge.instance_id") == iid]
    (start,) = [s for s in here if s["name"] == "selvedge.workflow.start"]
    # request -> workflow: the start span is the request span's child, and its context
    # is what the instance stores.
    assert (start["trace_id"], start["parent_id"]) == (trace_id, out["request"]["span_id"])
    traceparent = out["trace_context"]["traceparent"]
    assert traceparent.split("-")[1:3] == [trace_id, start["span_id"]]

    # workflow -> activities, before the suspension, in this process.
    attempts_here = [s for s in here if s["name"] == "selvedge.activity.attempt"]
    assert [s["attributes"]["selvedge.activity_name"] for s in attempts_here] == [
        "shop.reserve_stock"
    ]
    (suspended,) = [s for s in here if s["name"] == "selvedge.workflow.execute"]
    assert suspended["attributes"]["selvedge.outcome"] == "suspended"
    (send,) = [s for s in here if s["name"] == "selvedge.signal.send"]
    assert send["parent_id"] == out["approve_request"]
    for span in [*attempts_here, suspended]:
        assert (span["trace_id"], span["parent_id"]) == (trace_id, start["span_id"])

    # ... and after it, in the worker process: the same trace, under the same span.
    there = [s for s in out["worker_spans"] if s["attributes"].get("selvedge.instance_id") == iid]
    assert there, "the worker process exported no span of the order"
    for span in there:
        assert (span["trace_id"], span["parent_id"]) == (trace_id, start["span_id"]), span
    names = {
        s["attributes"]["selvedge.activity_name"]
        for s in there
        if s["name"] == "selvedge.activity.attempt"
    }
    assert {"shop.screen_payment", "shop.charge_payment", "shop.send_confirmation"} <= names
    executions = [s for s in there if s["name"] == "selvedge.workflow.execute"]
    outcomes = [s["attributes"]["selvedge.outcome"] for s in executions]
    assert outcomes[-1] == "completed"
    (receive,) = [s for s in there if s["name"] == "selvedge.signal.receive"]
    assert receive["links"] == [send["span_id"]]
    # The shipping child joins the order's trace too.
    child = [
        s
        for s in out["worker_spans"]
        if s["attributes"].get("selvedge.workflow_name") == "shop.shipping"
    ]
    assert child and {s["trace_id"] for s in child} == {trace_id}
    assert "shop.mark_shipped" in {s["attributes"].get("selvedge.activity_name") for s in child}

    # Metrics of this process: the start, the first attempt, its latency, the dispatch,
    # and the gauges its leader observed while the approved order waited for a worker.
    points = out["metrics_before_worker"]
    assert value(points, "selvedge.workflows.started", workflow_name="shop.order") == 1
    assert (
        value(points, "selvedge.activity.attempts", activity_name="shop.reserve_stock", queue="")
        == 1
    )
    assert (
        value(
            points,
            "selvedge.activity.duration",
            activity_name="shop.reserve_stock",
            outcome="completed",
        )
        == 1
    )
    assert (
        value(
            points,
            "selvedge.workflow.execution.duration",
            workflow_name="shop.order",
            outcome="suspended",
        )
        == 1
    )
    assert value(points, "selvedge.dispatch.lag", workflow_name="shop.order") == 1
    assert value(points, "selvedge.instances.runnable") == 1  # approved, not yet dispatched
    assert value(points, "selvedge.instances.oldest_runnable_age") >= 0
