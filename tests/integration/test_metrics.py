"""Metrics through the OpenTelemetry metrics API, read back with the SDK's in-memory reader.

``SELVEDGE["METRICS"]`` is given a real ``MeterProvider`` whose reader collects on
demand; the tests drive a worker with ``run_until_idle`` and read the points that
an operator's Prometheus would scrape.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import selvedge_django as sv
from selvedge_django import metrics
from selvedge_django.engine.events import HistoryRow
from selvedge_django.operations import client_store
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker


@sv.activity(
    name="metrics.flaky",
    retry_policy=sv.RetryPolicy(max_attempts=3, initial_interval=0.001, max_interval=0.001),
)
def flaky(value: int) -> int:
    info = sv.activity_info()
    assert info is not None
    if info.attempt == 1:
        raise RuntimeError("first attempt fails")
    return value * 2


@sv.activity(name="metrics.broken", retry_policy=sv.RetryPolicy(max_attempts=1))
def broken(_: Any) -> None:
    raise RuntimeError("always")


@sv.activity(
    name="metrics.slow",
    start_to_close_timeout=0.2,
    retry_policy=sv.RetryPolicy(max_attempts=1),
)
def slow(_: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the attempt's deadline cancels it
        sv.heartbeat()
        time.sleep(0.01)


@sv.workflow(name="metrics.flow")
def flow(ctx: sv.WorkflowContext, kind: str) -> Any:
    if kind == "broken":
        return broken.execute(ctx)
    if kind == "slow":
        return slow.execute(ctx)
    return flaky.execute(ctx, 21)


@sv.activity(name="metrics.elsewhere")
def elsewhere(_: Any) -> None:
    """Queued on a queue no worker of these tests serves."""


@sv.workflow(name="metrics.parked")
def parked(ctx: sv.WorkflowContext, _: Any) -> Any:
    return elsewhere.execute(ctx, None, options=sv.ActivityOptions(queue="nobody"))


@pytest.fixture
def reader(tdb: None, selvedge_clock: ControllableClock) -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with override_settings(SELVEDGE={**settings.SELVEDGE, "METRICS": provider}):
        yield reader
    metrics.clear_gauge_source()
    provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Instrument name -> its data points, from one collection."""
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == metrics.METER_NAME
            for metric in scope.metrics:
                found[metric.name] = list(metric.data.data_points)
    return found


def value(found: dict[str, list[Any]], name: str, **attributes: Any) -> Any:
    """The sum (counters), count (histograms) or value (gauges) of the matching point."""
    wanted = {f"selvedge.{k}": v for k, v in attributes.items()}
    for point in found.get(name, []):
        if dict(point.attributes) == wanted:
            if hasattr(point, "count"):
                return point.count
            return point.value
    return None


def test_lifecycle_counters_and_latency_histograms(reader: InMemoryMetricReader) -> None:
    worker = Worker()
    ok = sv.start_workflow(flow, "flaky")
    bad = sv.start_workflow(flow, "broken")
    late = sv.start_workflow(flow, "slow")
    deadline = time.monotonic() + 30
    while sv.describe(late).status == "running" or sv.describe(ok).status == "running":
        assert time.monotonic() < deadline
        run_until_idle(worker)
    assert sv.get_workflow_result(ok).output == 42
    assert sv.describe(bad).status == "failed"

    found = points(reader)
    assert value(found, metrics.WORKFLOWS_STARTED, workflow_name="metrics.flow") == 3
    assert (
        value(found, metrics.WORKFLOWS_CLOSED, workflow_name="metrics.flow", status="completed")
        == 1
    )
    assert (
        value(found, metrics.WORKFLOWS_CLOSED, workflow_name="metrics.flow", status="failed") == 2
    )
    assert value(found, metrics.ACTIVITY_ATTEMPTS, activity_name="metrics.flaky", queue="") == 2
    assert value(found, metrics.ACTIVITY_RETRIES, activity_name="metrics.flaky") == 1
    assert value(found, metrics.ACTIVITY_FAILURES, activity_name="metrics.broken") == 1
    assert value(found, metrics.ACTIVITY_FAILURES, activity_name="metrics.slow") == 1
    assert (
        value(
            found,
            metrics.ACTIVITY_TIMEOUTS,
            activity_name="metrics.slow",
            timeout_kind="start_to_close",
        )
        == 1
    )
    assert value(found, metrics.ACTIVITY_TIMEOUTS, activity_name="metrics.flaky") is None
    # Step latency: one point per attempt outcome.
    assert (
        value(found, metrics.ACTIVITY_DURATION, activity_name="metrics.flaky", outcome="retry") == 1
    )
    assert (
        value(found, metrics.ACTIVITY_DURATION, activity_name="metrics.flaky", outcome="completed")
        == 1
    )
    assert (
        value(
            found,
            metrics.ACTIVITY_SCHEDULE_TO_START,
            activity_name="metrics.flaky",
            queue="",
        )
        == 2
    )
    # Seconds, in buckets made for seconds (the SDK's default ones are for milliseconds).
    assert all(
        tuple(p.explicit_bounds) == metrics.LATENCY_BUCKETS
        for p in found[metrics.ACTIVITY_DURATION]
    )
    # Each instance was leased from the runnable queue at least once.
    assert value(found, metrics.DISPATCH_LAG, workflow_name="metrics.flow") >= 3
    executions = [
        p for p in found[metrics.WORKFLOW_EXECUTION_DURATION] if p.attributes["selvedge.outcome"]
    ]
    assert {p.attributes["selvedge.outcome"] for p in executions} >= {
        "suspended",
        "completed",
        "failed",
    }


def test_lease_takeovers_and_fenced_writes(reader: InMemoryMetricReader) -> None:
    iid = sv.start_workflow("metrics.flow", "flaky")
    store = client_store()
    ((ghost, _),) = store.instances.lease_batch("ghost-worker", 0.05, 1, None)
    deadline = time.monotonic() + 10
    while not _expired(store, iid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    run_until_idle(Worker())  # takes the expired lease over and runs the instance
    assert sv.describe(iid).status == "completed"
    with pytest.raises(sv.Fenced):
        store.record_command(ghost, HistoryRow("#9:late", 9, "activity"))
    found = points(reader)
    assert value(found, metrics.LEASE_TAKEOVERS, lease_kind="workflow") == 1
    assert value(found, metrics.FENCED_WRITES, lease_kind="workflow") >= 1


def _expired(store: Any, instance_id: str) -> bool:
    from selvedge_django.models import WorkflowInstance

    expires = (
        WorkflowInstance.objects.filter(pk=instance_id)
        .values_list("lease_expires_ms", flat=True)
        .first()
    )
    return expires is not None and store.now_ms() > expires


def test_the_leader_observes_queue_depth_and_oldest_runnable(
    reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "GAUGE_READING_TTL", 0.0)  # every collection reads
    worker = Worker(activity_queues=["default", ""])
    follower = Worker(activity_queues=["default", ""])
    sv.start_workflow(parked, instance_id="parked-1")
    sv.start_workflow(parked, instance_id="parked-2")
    run_until_idle(worker)  # both park on an activity in the queue "nobody" serves
    waiting = sv.start_workflow(flow, "flaky")  # runnable, not dispatched yet
    assert points(reader).get(metrics.QUEUE_DEPTH, []) == []  # nobody leads yet

    worker.leader.run_once()  # takes the leader lock
    follower.leader.run_once()  # does not
    assert worker.leader.is_leader and not follower.leader.is_leader
    found = points(reader)
    assert value(found, metrics.QUEUE_DEPTH, queue="nobody") == 2
    assert value(found, metrics.QUEUE_OLDEST_AGE, queue="nobody") >= 0
    assert value(found, metrics.INSTANCES_RUNNABLE) == 1
    assert value(found, metrics.INSTANCES_OLDEST_RUNNABLE_AGE) >= 0

    run_until_idle(worker)
    assert sv.describe(waiting).status == "completed"
    found = points(reader)
    assert value(found, metrics.INSTANCES_RUNNABLE) == 0
    assert value(found, metrics.QUEUE_DEPTH, queue="nobody") == 2

    worker.leader.resign()
    assert points(reader).get(metrics.QUEUE_DEPTH, []) == []


def test_with_metrics_off_recording_is_a_no_op(tdb: None) -> None:
    assert not metrics.enabled()
    metrics.record(metrics.WORKFLOWS_STARTED, 1, workflow_name="x")  # a no-op
    iid = sv.start_workflow(flow, "flaky")
    run_until_idle(Worker())
    assert sv.describe(iid).status == "completed"


def test_a_bad_metrics_setting_is_refused(tdb: None) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from selvedge_django.conf import get_settings

    with (
        override_settings(SELVEDGE={**settings.SELVEDGE, "METRICS": "yes please"}),
        pytest.raises(ImproperlyConfigured, match="METRICS"),
    ):
        get_settings()


def test_stream_entries_are_counted_by_writer(reader: InMemoryMetricReader) -> None:
    from tests.testapp.workflows.streams import run_once, steps

    sv.start_workflow(steps, 2)
    sv.start_workflow(run_once, "token")
    run_until_idle(Worker())
    found = points(reader)
    assert value(found, metrics.STREAM_ENTRIES, writer="workflow") == 2
    assert value(found, metrics.STREAM_ENTRIES, writer="activity") == 1
