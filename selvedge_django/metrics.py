"""Metrics through the OpenTelemetry metrics API (``SELVEDGE["METRICS"] = True``).

Install ``selvedge-django[otel]``. The meter is ``selvedge_django``; every
instrument's name starts with ``selvedge.`` (dots become underscores in
Prometheus, counters gain ``_total``, and seconds ``_seconds``). With ``True`` the
global meter provider is used (set it up as OpenTelemetry's docs say, for
example with a Prometheus reader); a ``MeterProvider`` object may be given
instead. With ``METRICS`` unset nothing here runs and OpenTelemetry is never
imported.

Counters and histograms are recorded where the work happens, after the write they
report (most of them from the lifecycle hooks' events, whether or not ``HOOKS`` is
set). The gauges are observed only in the process whose worker holds the leader
lock, with bounded queries (:mod:`selvedge_django.storage.gauges`), so a fleet
reports each queue once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import exceptions as exc

__all__ = [
    "ACTIVITY_ATTEMPTS",
    "ACTIVITY_DURATION",
    "ACTIVITY_FAILURES",
    "ACTIVITY_RETRIES",
    "ACTIVITY_RUNNING",
    "ACTIVITY_SCHEDULE_TO_START",
    "ACTIVITY_TIMEOUTS",
    "DISPATCH_LAG",
    "FENCED_WRITES",
    "INSTANCES_OLDEST_RUNNABLE_AGE",
    "INSTANCES_RUNNABLE",
    "INSTRUMENT_NAMES",
    "LEASE_TAKEOVERS",
    "METER_NAME",
    "QUEUE_DEPTH",
    "QUEUE_OLDEST_AGE",
    "STREAM_ENTRIES",
    "WORKFLOWS_CLOSED",
    "WORKFLOWS_STARTED",
    "WORKFLOW_CACHE_DECLINED",
    "WORKFLOW_CACHE_HITS",
    "WORKFLOW_CACHE_LET_GO",
    "WORKFLOW_CACHE_MISSES",
    "WORKFLOW_CACHE_PARKED",
    "WORKFLOW_EXECUTION_DURATION",
    "GaugeReading",
    "clear_gauge_source",
    "enabled",
    "record",
    "record_hook",
    "set_gauge_source",
]

METER_NAME = "selvedge_django"

# -- instrument names (SPEC section 16: they start with "selvedge.") ---------------------

WORKFLOWS_STARTED = "selvedge.workflows.started"  # counter {workflow}
WORKFLOWS_CLOSED = "selvedge.workflows.closed"  # counter {workflow, status}
WORKFLOW_EXECUTION_DURATION = "selvedge.workflow.execution.duration"  # s {workflow, outcome}
ACTIVITY_ATTEMPTS = "selvedge.activity.attempts"  # counter {activity, queue}
ACTIVITY_RETRIES = "selvedge.activity.retries"  # counter {activity}
ACTIVITY_FAILURES = "selvedge.activity.failures"  # counter {activity}: failed for good
ACTIVITY_TIMEOUTS = "selvedge.activity.timeouts"  # counter {activity, timeout_kind}
ACTIVITY_SCHEDULE_TO_START = "selvedge.activity.schedule_to_start"  # s {activity, queue}
ACTIVITY_DURATION = "selvedge.activity.duration"  # s, step latency {activity, outcome}
DISPATCH_LAG = "selvedge.dispatch.lag"  # s: runnable until leased {workflow}
LEASE_TAKEOVERS = "selvedge.lease.takeovers"  # counter {lease_kind}
FENCED_WRITES = "selvedge.fenced_writes"  # counter {lease_kind}
QUEUE_DEPTH = "selvedge.queue.depth"  # gauge {queue}: queued tasks
QUEUE_OLDEST_AGE = "selvedge.queue.oldest_age"  # gauge s {queue}: oldest due queued task
ACTIVITY_RUNNING = "selvedge.activity.running"  # gauge {queue}: claimed attempts
INSTANCES_RUNNABLE = "selvedge.instances.runnable"  # gauge: waiting for a dispatch
INSTANCES_OLDEST_RUNNABLE_AGE = "selvedge.instances.oldest_runnable_age"  # gauge s
# The workflow cache (SELVEDGE["WORKFLOW_CACHE"]), per worker process:
WORKFLOW_CACHE_HITS = "selvedge.workflow_cache.hits"  # counter: continued without replay
WORKFLOW_CACHE_MISSES = "selvedge.workflow_cache.misses"  # counter {reason}: replayed
WORKFLOW_CACHE_PARKED = "selvedge.workflow_cache.parked"  # counter: executions kept
WORKFLOW_CACHE_LET_GO = "selvedge.workflow_cache.let_go"  # counter {reason}
WORKFLOW_CACHE_DECLINED = "selvedge.workflow_cache.declined"  # counter: not kept
STREAM_ENTRIES = "selvedge.stream.entries"  # counter {writer}: stream entries written

INSTRUMENT_NAMES = (
    WORKFLOWS_STARTED,
    WORKFLOWS_CLOSED,
    WORKFLOW_EXECUTION_DURATION,
    ACTIVITY_ATTEMPTS,
    ACTIVITY_RETRIES,
    ACTIVITY_FAILURES,
    ACTIVITY_TIMEOUTS,
    ACTIVITY_SCHEDULE_TO_START,
    ACTIVITY_DURATION,
    DISPATCH_LAG,
    LEASE_TAKEOVERS,
    FENCED_WRITES,
    QUEUE_DEPTH,
    QUEUE_OLDEST_AGE,
    ACTIVITY_RUNNING,
    INSTANCES_RUNNABLE,
    INSTANCES_OLDEST_RUNNABLE_AGE,
    WORKFLOW_CACHE_HITS,
    WORKFLOW_CACHE_MISSES,
    WORKFLOW_CACHE_PARKED,
    WORKFLOW_CACHE_LET_GO,
    WORKFLOW_CACHE_DECLINED,
    STREAM_ENTRIES,
)

_COUNTERS = {
    WORKFLOWS_STARTED: "workflow instances started",
    WORKFLOWS_CLOSED: "workflow instances closed, by status",
    ACTIVITY_ATTEMPTS: "activity attempts begun (claims)",
    ACTIVITY_RETRIES: "activity attempts that failed and were scheduled again",
    ACTIVITY_FAILURES: "activities that failed for good",
    ACTIVITY_TIMEOUTS: "activity attempts that timed out, by kind",
    LEASE_TAKEOVERS: "leases and claims taken over after they lapsed",
    FENCED_WRITES: "writes refused because the writer no longer held its lease or claim",
    WORKFLOW_CACHE_HITS: "leases that continued a parked execution without a replay",
    WORKFLOW_CACHE_MISSES: "leases replayed while the workflow cache was on, by reason",
    WORKFLOW_CACHE_PARKED: "suspended executions kept in the workflow cache",
    WORKFLOW_CACHE_LET_GO: "parked executions let go (evicted, replaced, stopped, mismatched)",
    WORKFLOW_CACHE_DECLINED: "suspensions the cache could not keep (size or thread bound)",
    STREAM_ENTRIES: "stream entries written, by writer (workflow, activity)",
}
_HISTOGRAMS = {
    WORKFLOW_EXECUTION_DURATION: "one execution, from its lease to suspension or close",
    ACTIVITY_SCHEDULE_TO_START: "an activity task due until an attempt claimed it",
    ACTIVITY_DURATION: "one activity attempt, to its recorded outcome",
    DISPATCH_LAG: "an instance runnable until a dispatcher leased it",
}
_GAUGES = {
    QUEUE_DEPTH: ("{task}", "queued activity tasks per queue"),
    QUEUE_OLDEST_AGE: ("s", "age of the oldest due queued task per queue"),
    ACTIVITY_RUNNING: ("{attempt}", "running activity attempts per queue"),
    INSTANCES_RUNNABLE: ("{instance}", "instances waiting for a dispatch"),
    INSTANCES_OLDEST_RUNNABLE_AGE: ("s", "how long the oldest of them has waited"),
}

# Bucket boundaries of the latency histograms, in seconds (the SDK's default ones are
# made for milliseconds: every latency under 5 s would land in one bucket).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip

# The gauges' readings are shared by one collection's callbacks for this long.
GAUGE_READING_TTL = 1.0


@dataclass(frozen=True)
class GaugeReading:
    """What the leader's bounded queries saw: per queue, and for dispatch."""

    queued: dict[str, int]
    oldest_queued_age_s: dict[str, float]
    running: dict[str, int]
    runnable_instances: int
    oldest_runnable_age_s: float


class _Instruments:
    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation

        self.observation = Observation
        self.counters = {
            name: meter.create_counter(name, unit="1", description=text)
            for name, text in _COUNTERS.items()
        }
        self.histograms = {
            name: _histogram(meter, name, text) for name, text in _HISTOGRAMS.items()
        }
        for name, (unit, text) in _GAUGES.items():
            meter.create_observable_gauge(
                name, callbacks=[self._callback(name)], unit=unit, description=text
            )

    def _callback(self, name: str) -> Callable[[Any], Iterable[Any]]:
        def observe(options: Any) -> Iterable[Any]:
            reading = _reading()
            if reading is None:
                return []
            obs = self.observation
            if name == QUEUE_DEPTH:
                return [obs(n, {"selvedge.queue": q}) for q, n in reading.queued.items()]
            if name == QUEUE_OLDEST_AGE:
                return [
                    obs(age, {"selvedge.queue": q})
                    for q, age in reading.oldest_queued_age_s.items()
                ]
            if name == ACTIVITY_RUNNING:
                return [obs(n, {"selvedge.queue": q}) for q, n in reading.running.items()]
            if name == INSTANCES_RUNNABLE:
                return [obs(reading.runnable_instances)]
            return [obs(reading.oldest_runnable_age_s)]

        return observe


def _histogram(meter: Any, name: str, text: str) -> Any:
    return meter.create_histogram(
        name, unit="s", description=text, explicit_bucket_boundaries_advisory=LATENCY_BUCKETS
    )


_lock = threading.Lock()
_built: tuple[Any, _Instruments] | None = None
_source: Callable[[], GaugeReading] | None = None
_last_reading: tuple[float, GaugeReading | None] | None = None


def _setting() -> Any:
    from .conf import get_settings

    return get_settings().metrics


def enabled() -> bool:
    """Whether ``SELVEDGE["METRICS"]`` is on."""
    return bool(_setting())


def _instruments() -> _Instruments | None:
    global _built
    setting = _setting()
    if not setting:
        return None
    provider = None if setting is True else setting
    with _lock:
        if _built is not None and _built[0] is provider:
            return _built[1]
        from opentelemetry import metrics

        meter = (
            metrics.get_meter(METER_NAME) if provider is None else provider.get_meter(METER_NAME)
        )
        built = _Instruments(meter)
        _built = (provider, built)
        return built


def record(name: str, value: float, **attributes: Any) -> None:
    """Add to a counter or record into a histogram (nothing when metrics are off)."""
    instruments = _instruments()
    if instruments is None:
        return
    attrs = {f"selvedge.{k}": v for k, v in attributes.items() if v is not None}
    try:
        counter = instruments.counters.get(name)
        if counter is not None:
            counter.add(value, attrs)
        else:
            instruments.histograms[name].record(value, attrs)
    except Exception:
        pass  # observability never changes an outcome


def record_hook(hook: str, fields: dict[str, Any]) -> None:
    """Record what one lifecycle event counts (called for every hook that fires)."""
    if not enabled():
        return
    workflow = fields.get("workflow_name") or None
    activity = fields.get("activity_name")
    duration = fields.get("duration")
    error = fields.get("error")
    if hook == "on_workflow_started":
        record(WORKFLOWS_STARTED, 1, workflow_name=workflow)
    elif hook in ("on_workflow_completed", "on_workflow_failed", "on_workflow_cancelled"):
        status = hook.removeprefix("on_workflow_")
        record(WORKFLOWS_CLOSED, 1, workflow_name=workflow, status=status)
        if duration:  # a terminate or a close without an execution records none
            record(WORKFLOW_EXECUTION_DURATION, duration, workflow_name=workflow, outcome=status)
    elif hook == "on_workflow_suspended":
        if duration is not None:
            record(
                WORKFLOW_EXECUTION_DURATION, duration, workflow_name=workflow, outcome="suspended"
            )
    elif hook in ("on_activity_completed", "on_activity_retry", "on_activity_failed"):
        outcome = {"on_activity_completed": "completed", "on_activity_retry": "retry"}.get(
            hook, "failed"
        )
        if duration is not None:
            record(ACTIVITY_DURATION, duration, activity_name=activity, outcome=outcome)
        if hook == "on_activity_retry":
            record(ACTIVITY_RETRIES, 1, activity_name=activity)
        elif hook == "on_activity_failed":
            record(ACTIVITY_FAILURES, 1, activity_name=activity)
        timeout = _timeout_of(error)
        if timeout is not None:
            record(ACTIVITY_TIMEOUTS, 1, activity_name=activity, timeout_kind=timeout)


def _timeout_of(error: Any) -> str | None:
    """The kind of the attempt's timeout, when the error reports one."""
    if isinstance(error, exc.RetryExhaustedError):
        error = error.last_error
    if isinstance(error, exc.ActivityTimeoutError):
        return str(error.kind)
    return None


# -- the leader's gauges -------------------------------------------------------------------


def set_gauge_source(source: Callable[[], GaugeReading]) -> None:
    """Observe the gauges through ``source`` (the leader, while it holds the lock)."""
    global _source, _last_reading
    with _lock:
        _source, _last_reading = source, None


def clear_gauge_source(source: Callable[[], GaugeReading] | None = None) -> None:
    """Stop observing the gauges (only ``source``'s, when given)."""
    global _source, _last_reading
    with _lock:
        if source is None or _source is source:
            _source, _last_reading = None, None


def _reading() -> GaugeReading | None:
    """One reading per collection (its callbacks run one after another)."""
    global _last_reading
    with _lock:
        source, last = _source, _last_reading
    if source is None:
        return None
    now = time.monotonic()
    if last is not None and now - last[0] < GAUGE_READING_TTL:
        return last[1]
    try:
        reading: GaugeReading | None = source()
    except Exception:
        reading = None
    with _lock:
        if _source is source:
            _last_reading = (now, reading)
    return reading
