"""OpenTelemetry traces that follow the work (``pip install selvedge-django[otel]``).

Set ``SELVEDGE["HOOKS"] = "selvedge_django.contrib.otel.OpenTelemetryHooks"``.

The trace of a run starts where the run is started: ``start_workflow`` (in a
Django request, a management command, a shell) opens a short
``selvedge.workflow.start`` span under the span current there and stores its W3C
trace context with the instance. Every later span of the run, in whatever worker
process and after any number of suspensions, is a child of that span:

- ``selvedge.workflow.execute``: one per execution (from the lease to the
  suspension or the close), ``selvedge.outcome`` = ``suspended``, ``completed``,
  ``failed`` or ``cancelled``; a cancelled one links to the ``cancel_workflow``
  caller's ``selvedge.workflow.cancel`` span;
- ``selvedge.activity.attempt``: one per attempt, ``selvedge.outcome`` =
  ``completed``, ``retry`` or ``failed``;
- ``selvedge.timer.fire`` and ``selvedge.signal.receive`` (a delivery, linked to
  the sender's ``selvedge.signal.send`` span, itself a child of the span current
  at ``signal()``);
- zero-length markers ``selvedge.workflow.replay`` and
  ``selvedge.activity.cache_hit``.

A child workflow's spans join its parent's trace. An instance started with no
hooks configured (or by a schedule) has no stored context: its spans are roots.

What a span carries: the instance id, workflow name, history key, activity name,
attempt and worker id as ``selvedge.*`` attributes; ``messaging.*`` attributes
(OpenTelemetry's messaging conventions) on signal sends and deliveries; for a
failure, status ERROR with the error's message as its description, ``error.type``
and an ``exception`` event with the error's type, message and traceback. Ids and
messages are whatever your code chose (an id may hold an email address, a
message a card number): pass ``record_exception=False`` to keep messages and
tracebacks out (the description is then the error's type name), and ``scrub`` to
rewrite every text before it is exported.

Reading a stored context costs one indexed read per instance per process (the
contexts are kept in a bounded cache; they never change).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from ..hooks import HookEvent, WorkflowHooks, parse_trace_context

__all__ = ["OpenTelemetryHooks"]

Scrubber = Callable[[str, str], str]

# Hook -> (span name, selvedge.outcome) of the spans that end when the hook fires.
_ENDING = {
    "on_workflow_suspended": ("selvedge.workflow.execute", "suspended"),
    "on_workflow_completed": ("selvedge.workflow.execute", "completed"),
    "on_workflow_failed": ("selvedge.workflow.execute", "failed"),
    "on_workflow_cancelled": ("selvedge.workflow.execute", "cancelled"),
    "on_activity_completed": ("selvedge.activity.attempt", "completed"),
    "on_activity_retry": ("selvedge.activity.attempt", "retry"),
    "on_activity_failed": ("selvedge.activity.attempt", "failed"),
    "on_timer_fired": ("selvedge.timer.fire", None),
    "on_signal_received": ("selvedge.signal.receive", None),
    "on_workflow_replayed": ("selvedge.workflow.replay", None),
    "on_activity_cache_hit": ("selvedge.activity.cache_hit", None),
    "on_workflow_started": ("selvedge.workflow.start", None),
}

# Spans made in the caller's thread by trace_context(), per operation.
_CALLER_SPANS = {
    "start": "selvedge.workflow.start",
    "signal": "selvedge.signal.send",
    "cancel": "selvedge.workflow.cancel",
    "fork": "selvedge.workflow.fork",
    "resume": "selvedge.workflow.resume",
    "schedule": "selvedge.schedule.fire",
}

_MISSING = object()


class OpenTelemetryHooks(WorkflowHooks):
    """Turn the lifecycle into OpenTelemetry spans of one trace per run.

    ``record_exception=False`` leaves failures' messages and tracebacks out of
    the spans (status ERROR, described by the error's type name only).
    ``scrub(name, value)`` is called for every text the spans would carry, with
    its attribute name (``selvedge.instance_id``, ``selvedge.key``,
    ``exception.message``, ``exception.stacktrace``, ``status.description``, ...),
    and its return value is exported instead: mask emails, card numbers or ids
    there (a deterministic mask keeps spans of one instance correlated).
    ``propagator`` stores and reads the context (default: W3C Trace Context);
    ``cache_size`` bounds the stored contexts kept in memory.
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        tracer_name: str = "selvedge_django",
        *,
        record_exception: bool = True,
        scrub: Scrubber | None = None,
        propagator: Any = None,
        cache_size: int = 4096,
    ) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self.tracer = trace.get_tracer(tracer_name, tracer_provider=tracer_provider)
        self.record_exception = record_exception
        self.scrub = scrub
        self.propagator = propagator if propagator is not None else TraceContextTextMapPropagator()
        self.cache_size = max(0, cache_size)
        self._lock = threading.Lock()
        self._contexts: OrderedDict[str, dict[str, str] | None] = OrderedDict()
        # Instances whose start span trace_context() made (on_workflow_started skips them).
        self._started: OrderedDict[str, None] = OrderedDict()

    # -- texts and attributes -------------------------------------------------------------

    def _text(self, name: str, value: str) -> str:
        return value if self.scrub is None else str(self.scrub(name, value))

    def _attributes(self, event: HookEvent) -> dict[str, Any]:
        texts: dict[str, str | None] = {
            "selvedge.instance_id": event.instance_id,
            "selvedge.workflow_name": event.workflow_name or None,
            "selvedge.key": event.key,
            "selvedge.activity_name": event.activity_name,
            "selvedge.worker_id": event.worker_id,
        }
        attributes: dict[str, Any] = {
            name: self._text(name, value) for name, value in texts.items() if value is not None
        }
        if event.attempt is not None:
            attributes["selvedge.attempt"] = event.attempt
        return attributes

    # -- stored contexts ------------------------------------------------------------------

    def _remember(self, cache: OrderedDict[str, Any], key: str, value: Any) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self.cache_size:
                cache.popitem(last=False)

    def _instance_carrier(self, instance_id: str) -> dict[str, str] | None:
        """The instance's stored start context (cached; one read per instance)."""
        with self._lock:
            found = self._contexts.get(instance_id, _MISSING)
            if found is not _MISSING:
                self._contexts.move_to_end(instance_id)
                return found  # type: ignore[return-value]
        text = _read_instance_context(instance_id, "trace_context")
        carrier = parse_trace_context(text)
        self._remember(self._contexts, instance_id, carrier)
        return carrier

    def _context(self, carrier: Mapping[str, str] | None) -> Any:
        from opentelemetry.context import Context

        if not carrier:
            return Context()  # a root, never whatever span this thread has current
        return self.propagator.extract(dict(carrier), context=Context())

    def _link(self, carrier: Mapping[str, str] | None) -> list[Any]:
        from opentelemetry.trace import Link

        if not carrier:
            return []
        span_context = self._trace.get_current_span(self._context(carrier)).get_span_context()
        return [Link(span_context)] if span_context.is_valid else []

    # -- the caller's side ----------------------------------------------------------------

    def trace_context(self, operation: str, event: HookEvent) -> Mapping[str, str] | None:
        """Open and close the caller's span of a start, signal, cancel, fork, resume or
        schedule run; return its context (the new run's start span for a start, a
        fork and a schedule run)."""
        from opentelemetry.trace import SpanKind

        name = _CALLER_SPANS.get(operation)
        if name is None:
            return None
        attributes = self._attributes(event)
        links: list[Any] = []
        if operation == "signal":
            attributes.pop("selvedge.key", None)
            attributes.update(_messaging("send", self._text("selvedge.key", event.key or "")))
        if operation == "fork" and event.source:
            links = self._link(self._instance_carrier(event.source))
            attributes["selvedge.forked_from"] = self._text("selvedge.forked_from", event.source)
        elif operation == "schedule":
            if event.source:
                attributes["selvedge.schedule"] = self._text("selvedge.schedule", event.source)
        elif operation != "start":
            links = self._link(self._instance_carrier(event.instance_id))
        span = self.tracer.start_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes, links=links
        )
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        span.end()
        if operation in ("start", "fork", "schedule"):
            self._remember(self._contexts, event.instance_id, carrier)
        if operation in ("start", "schedule"):  # their on_workflow_started makes no span
            self._remember(self._started, event.instance_id, None)
        return carrier

    # -- the workers' side ----------------------------------------------------------------

    def _emit(self, hook: str, event: HookEvent) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        name, outcome = _ENDING[hook]
        attributes = self._attributes(event)
        if outcome is not None:
            attributes["selvedge.outcome"] = outcome
        links: list[Any] = []
        if hook == "on_signal_received":
            links = self._link(_signal_carrier(event.instance_id, event.key))
            attributes.update(_messaging("process", None))
        elif hook == "on_workflow_cancelled":
            links = self._link(
                parse_trace_context(
                    _read_instance_context(event.instance_id, "cancel_trace_context")
                )
            )
        end = time.time_ns()
        start = end
        if event.duration is not None and event.duration > 0:
            start = end - int(event.duration * 1_000_000_000)
        span = self.tracer.start_span(
            name,
            context=self._context(self._instance_carrier(event.instance_id)),
            kind=SpanKind.CONSUMER if hook == "on_signal_received" else SpanKind.INTERNAL,
            start_time=start,
            attributes=attributes,
            links=links,
        )
        error = event.error
        if error is not None:
            type_name = self._text("error.type", type(error).__qualname__)
            span.set_attribute("error.type", type_name)
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
        with self._lock:
            made_here = self._started.pop(event.instance_id, _MISSING) is not _MISSING
        if not made_here:  # a child's or a schedule's start: no caller span was made
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
        """No span of its own: the attempt's span starts here and ends with its outcome."""

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


def _messaging(operation: str, channel: str | None) -> dict[str, Any]:
    """OpenTelemetry's messaging attributes of a signal send or delivery."""
    attributes: dict[str, Any] = {
        "messaging.system": "selvedge",
        "messaging.operation.type": operation,
    }
    if channel:
        attributes["messaging.destination.name"] = channel
    return attributes


def _read_instance_context(instance_id: str, column: str) -> str | None:
    """One stored context column of an instance (None when absent or unreadable)."""
    from ..conf import get_settings
    from ..models import WorkflowInstance

    try:
        return (
            WorkflowInstance.objects.using(get_settings().database)
            .filter(instance_id=instance_id)
            .values_list(column, flat=True)
            .first()
        )
    except Exception:
        return None  # observability never changes an outcome


def _signal_carrier(instance_id: str, key: str | None) -> dict[str, str] | None:
    """The stored context of the signal that the receive at ``key`` consumed."""
    from ..conf import get_settings
    from ..models import SignalMessage

    if not key:
        return None
    try:
        text = (
            SignalMessage.objects.using(get_settings().database)
            .filter(instance_id=instance_id, consumed_key=key)
            .values_list("trace_context", flat=True)
            .first()
        )
    except Exception:
        return None
    return parse_trace_context(text)
