"""OpenTelemetry spans for the workflow lifecycle (``pip install selvedge-django[otel]``).

Set ``SELVEDGE["HOOKS"] = "selvedge_django.contrib.otel.OpenTelemetryHooks"``.
Every lifecycle callback becomes one *completed* span: start, retry and cache-hit
callbacks are zero-length markers; completion spans start ``duration`` seconds
before they end. Spans never stay open across a suspension or a handoff to
another worker; correlate them through the ``selvedge.instance_id`` and
``selvedge.key`` attributes.
"""

from __future__ import annotations

import time
from typing import Any

from ..hooks import HookEvent, WorkflowHooks

__all__ = ["OpenTelemetryHooks"]

_SPAN_NAMES = {
    "on_workflow_started": "selvedge.workflow.start",
    "on_workflow_replayed": "selvedge.workflow.replay",
    "on_workflow_suspended": "selvedge.workflow.suspend",
    "on_workflow_completed": "selvedge.workflow.complete",
    "on_workflow_failed": "selvedge.workflow.fail",
    "on_workflow_cancelled": "selvedge.workflow.cancel",
    "on_activity_started": "selvedge.activity.start",
    "on_activity_completed": "selvedge.activity.complete",
    "on_activity_failed": "selvedge.activity.fail",
    "on_activity_retry": "selvedge.activity.retry",
    "on_activity_cache_hit": "selvedge.activity.cache_hit",
    "on_signal_received": "selvedge.signal.receive",
    "on_timer_fired": "selvedge.timer.fire",
}


class OpenTelemetryHooks(WorkflowHooks):
    """Turn lifecycle callbacks into completed OpenTelemetry spans."""

    def __init__(self, tracer_provider: Any = None, tracer_name: str = "selvedge_django") -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = trace.get_tracer(tracer_name, tracer_provider=tracer_provider)

    def _emit(self, hook: str, event: HookEvent) -> None:
        from opentelemetry.trace import Status, StatusCode

        attributes: dict[str, Any] = {
            "selvedge.instance_id": event.instance_id,
            "selvedge.workflow_name": event.workflow_name,
        }
        if event.key is not None:
            attributes["selvedge.key"] = event.key
        if event.activity_name is not None:
            attributes["selvedge.activity_name"] = event.activity_name
        if event.attempt is not None:
            attributes["selvedge.attempt"] = event.attempt
        if event.worker_id is not None:
            attributes["selvedge.worker_id"] = event.worker_id
        end = time.time_ns()
        start = end
        if event.duration is not None and event.duration > 0:
            start = end - int(event.duration * 1_000_000_000)
        span = self.tracer.start_span(_SPAN_NAMES[hook], start_time=start, attributes=attributes)
        if event.error is not None:
            if isinstance(event.error, Exception):
                span.record_exception(event.error)
            span.set_status(Status(StatusCode.ERROR, str(event.error)))
        span.end(end_time=end)

    def on_workflow_started(self, event: HookEvent) -> None:
        self._emit("on_workflow_started", event)

    def on_workflow_replayed(self, event: HookEvent) -> None:
        self._emit("on_workflow_replayed", event)

    def on_workflow_suspended(self, event: HookEvent) -> None:
        self._emit("on_workflow_suspended", event)

    def on_workflow_completed(self, event: HookEvent) -> None:
        self._emit("on_workflow_completed", event)

    def on_workflow_failed(self, event: HookEvent) -> None:
        self._emit("on_workflow_failed", event)

    def on_workflow_cancelled(self, event: HookEvent) -> None:
        self._emit("on_workflow_cancelled", event)

    def on_activity_started(self, event: HookEvent) -> None:
        self._emit("on_activity_started", event)

    def on_activity_completed(self, event: HookEvent) -> None:
        self._emit("on_activity_completed", event)

    def on_activity_failed(self, event: HookEvent) -> None:
        self._emit("on_activity_failed", event)

    def on_activity_retry(self, event: HookEvent) -> None:
        self._emit("on_activity_retry", event)

    def on_activity_cache_hit(self, event: HookEvent) -> None:
        self._emit("on_activity_cache_hit", event)

    def on_signal_received(self, event: HookEvent) -> None:
        self._emit("on_signal_received", event)

    def on_timer_fired(self, event: HookEvent) -> None:
        self._emit("on_timer_fired", event)
