"""Lifecycle hooks: subclass :class:`WorkflowHooks` and name it in ``SELVEDGE["HOOKS"]``.

Each callback receives one :class:`HookEvent`, fires once, after the durable
write it reports, and never during replay or queries. A hook that raises is
logged and ignored: observability never changes an outcome.

One method is not a callback: :meth:`WorkflowHooks.trace_context` is asked,
*before* the write of a start, a signal or a cancel request, for the trace
context to store with it (W3C ``traceparent`` and ``tracestate``), so that the
spans of the work that follows, in any worker process, join the caller's trace.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import metrics

__all__ = [
    "HOOK_NAMES",
    "TRACE_OPERATIONS",
    "HookEvent",
    "WorkflowHooks",
    "capture_trace_context",
    "fire",
    "listened",
    "parse_trace_context",
    "schedule_trace",
]

logger = logging.getLogger("selvedge_django.hooks")

HOOK_NAMES = (
    "on_workflow_started",
    "on_workflow_replayed",
    "on_workflow_suspended",
    "on_workflow_completed",
    "on_workflow_failed",
    "on_workflow_cancelled",
    "on_activity_started",
    "on_activity_completed",
    "on_activity_failed",
    "on_activity_retry",
    "on_activity_cache_hit",
    "on_signal_received",
    "on_timer_fired",
)

# The writes whose trace context is asked for: a start (stored on the instance), a
# signal (on the signal), a cancel request (on the instance), a fork (on the new
# instance), a resume (not stored: the run keeps its start's), and a run a schedule
# starts (on the run; the leader's or the triggering caller's context).
TRACE_OPERATIONS = ("start", "signal", "cancel", "fork", "resume", "schedule")

# W3C Trace Context: ``version-trace_id-parent_id-flags``; ``tracestate`` at most 512
# characters. Anything else a hook returns is dropped, so stored contexts stay small.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_MAX = 512


@dataclass(frozen=True)
class HookEvent:
    """What a lifecycle callback reports."""

    instance_id: str
    workflow_name: str
    key: str | None = None
    activity_name: str | None = None
    attempt: int | None = None
    error: BaseException | None = None
    duration: float | None = None
    worker_id: str | None = None
    # trace_context() only: a fork's source instance, a schedule run's schedule name.
    source: str | None = None


class WorkflowHooks:
    """No-op lifecycle callbacks; override the ones you need."""

    def on_workflow_started(self, event: HookEvent) -> None:
        """An instance was created."""

    def on_workflow_replayed(self, event: HookEvent) -> None:
        """An execution began replaying recorded history."""

    def on_workflow_suspended(self, event: HookEvent) -> None:
        """An execution suspended and released its lease."""

    def on_workflow_completed(self, event: HookEvent) -> None:
        """The instance closed as completed."""

    def on_workflow_failed(self, event: HookEvent) -> None:
        """The instance closed as failed."""

    def on_workflow_cancelled(self, event: HookEvent) -> None:
        """The instance closed as cancelled."""

    def on_activity_started(self, event: HookEvent) -> None:
        """An attempt claimed its task."""

    def on_activity_completed(self, event: HookEvent) -> None:
        """An attempt recorded its result."""

    def on_activity_failed(self, event: HookEvent) -> None:
        """An activity failed for good."""

    def on_activity_retry(self, event: HookEvent) -> None:
        """An attempt failed and its task went back to the queue."""

    def on_activity_cache_hit(self, event: HookEvent) -> None:
        """Replay returned a recorded activity outcome."""

    def on_signal_received(self, event: HookEvent) -> None:
        """A receive consumed a signal."""

    def on_timer_fired(self, event: HookEvent) -> None:
        """A timer fired."""

    def on_payload_undecodable(self, event: HookEvent) -> None:
        """This worker cannot decode a stored value of the instance (``event.error``, a
        :class:`~selvedge_django.exceptions.PayloadDecodeError` naming the key id) and
        left it, unchanged, for a worker that has the key."""

    def trace_context(self, operation: str, event: HookEvent) -> Mapping[str, str] | None:
        """Return the trace context to store with a start, signal, cancel request,
        fork or schedule run (asked for a resume too, and not stored).

        ``operation`` is one of :data:`TRACE_OPERATIONS`. Called in the caller's
        thread before the write (which may still fail or roll back; a fork's and a
        schedule run's inside the transaction that creates the instance, once its id
        is known; a resume's after its write); ``event.source`` names a fork's
        source instance and a schedule run's schedule. The mapping holds W3C
        ``traceparent`` and optionally ``tracestate``. None stores nothing.
        """
        return None


def fire(hooks: Any, name: str, **fields: Any) -> None:
    """Call ``hooks.<name>(HookEvent(**fields))``, logging and swallowing its errors.

    The event is counted by the metrics first (when ``SELVEDGE["METRICS"]`` is on).
    """
    metrics.record_hook(name, fields)
    if hooks is None:
        return
    callback = getattr(hooks, name, None)
    if callback is None:
        return
    try:
        callback(HookEvent(**fields))
    except Exception:
        logger.exception("hook %s raised; ignored", name)


def listened(hooks: Any, name: str) -> bool:
    """Whether :func:`fire` for ``name`` does anything: the metrics count it, or
    ``hooks`` defines it. (A caller firing many events may skip them all when not.)"""
    return metrics.enabled() or getattr(hooks, name, None) is not None


def capture_trace_context(hooks: Any, operation: str, **fields: Any) -> str | None:
    """Ask ``hooks.trace_context`` for the context to store; return it as JSON text.

    Only a valid W3C ``traceparent`` (and a ``tracestate`` of at most 512
    characters) is kept; anything else, or a hook that raises, stores nothing.
    """
    method = getattr(hooks, "trace_context", None)
    if method is None:
        return None
    try:
        carrier = method(operation, HookEvent(**fields))
    except Exception:
        logger.exception("hook trace_context raised; ignored")
        return None
    if not isinstance(carrier, Mapping):
        return None
    parent = carrier.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.fullmatch(parent):
        return None
    kept = {"traceparent": parent}
    state = carrier.get("tracestate")
    if isinstance(state, str) and state and len(state) <= _TRACESTATE_MAX:
        kept["tracestate"] = state
    return json.dumps(kept, separators=(",", ":"))


def schedule_trace(hooks: Any) -> Callable[[str, Any], str | None]:
    """The trace context of each run a schedule starts: ``(run id, schedule row)``."""

    def trace(run_id: str, schedule: Any) -> str | None:
        return capture_trace_context(
            hooks,
            "schedule",
            instance_id=run_id,
            workflow_name=schedule.workflow_name,
            source=schedule.name,
        )

    return trace


def parse_trace_context(text: str | None) -> dict[str, str] | None:
    """The stored JSON text of a trace context as a carrier (None when absent or bad)."""
    if not text:
        return None
    try:
        carrier = json.loads(text)
    except ValueError:
        return None
    if not isinstance(carrier, dict):
        return None
    return {
        k: v
        for k, v in carrier.items()
        if k in ("traceparent", "tracestate") and isinstance(v, str)
    } or None
