"""OpenTelemetry spans for the workflow lifecycle (``pip install selvedge-django[otel]``).

Set ``SELVEDGE["HOOKS"] = "selvedge_django.contrib.otel.OpenTelemetryHooks"``.
Every lifecycle callback becomes one *completed* span: start, retry and cache-hit
callbacks are zero-length markers; completion spans start ``duration`` seconds
before they end. Spans never stay open across a suspension or a handoff to
another worker; correlate them through the ``selvedge.instance_id`` and
``selvedge.key`` attributes.

What a span carries: the instance id, workflow name, history key, activity name,
attempt and worker id as attributes; for a failure, status ERROR with the error's
message as its description and an ``exception`` event with the error's type,
message and traceback. Ids and messages are whatever your code chose (an id may
hold an email address, a message a card number): pass ``record_exception=False``
to keep messages and tracebacks out (the description is then the error's type
name), and ``scrub`` to rewrite every text before it is exported.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
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


Scrubber = Callable[[str, str], str]


class OpenTelemetryHooks(WorkflowHooks):
    """Turn lifecycle callbacks into completed OpenTelemetry spans.

    ``record_exception=False`` leaves failures' messages and tracebacks out of
    the spans (status ERROR, described by the error's type name only).
    ``scrub(name, value)`` is called for every text the spans would carry, with
    its attribute name (``selvedge.instance_id``, ``selvedge.key``,
    ``exception.message``, ``exception.stacktrace``, ``status.description``, ...),
    and its return value is exported instead: mask emails, card numbers or ids
    there (a deterministic mask keeps spans of one instance correlated).
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        tracer_name: str = "selvedge_django",
        *,
        record_exception: bool = True,
        scrub: Scrubber | None = None,
    ) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = trace.get_tracer(tracer_name, tracer_provider=tracer_provider)
        self.record_exception = record_exception
        self.scrub = scrub

    def _text(self, name: str, value: str) -> str:
        return value if self.scrub is None else str(self.scrub(name, value))

    def _emit(self, hook: str, event: HookEvent) -> None:
        from opentelemetry.trace import Status, StatusCode

        texts: dict[str, str | None] = {
            "selvedge.instance_id": event.instance_id,
            "selvedge.workflow_name": event.workflow_name,
            "selvedge.key": event.key,
            "selvedge.activity_name": event.activity_name,
            "selvedge.worker_id": event.worker_id,
        }
        attributes: dict[str, Any] = {
            name: self._text(name, value) for name, value in texts.items() if value is not None
        }
        if event.attempt is not None:
            attributes["selvedge.attempt"] = event.attempt
        end = time.time_ns()
        start = end
        if event.duration is not None and event.duration > 0:
            start = end - int(event.duration * 1_000_000_000)
        span = self.tracer.start_span(_SPAN_NAMES[hook], start_time=start, attributes=attributes)
        error = event.error
        if error is not None:
            if not self.record_exception:
                description = type(error).__name__
            else:
                description = str(error)
                if isinstance(error, Exception):
                    stack = "".join(
                        traceback.format_exception(type(error), error, error.__traceback__)
                    )
                    span.record_exception(
                        error,
                        attributes={
                            "exception.type": self._text(
                                "exception.type", type(error).__qualname__
                            ),
                            "exception.message": self._text("exception.message", str(error)),
                            "exception.stacktrace": self._text("exception.stacktrace", stack),
                        },
                    )
            span.set_status(Status(StatusCode.ERROR, self._text("status.description", description)))
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
