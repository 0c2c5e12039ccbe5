"""Lifecycle hooks: subclass :class:`WorkflowHooks` and name it in ``SELVEDGE["HOOKS"]``.

Each callback receives one :class:`HookEvent`, fires once, after the durable
write it reports, and never during replay or queries. A hook that raises is
logged and ignored: observability never changes an outcome.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["HOOK_NAMES", "HookEvent", "WorkflowHooks", "fire"]

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


def fire(hooks: Any, name: str, **fields: Any) -> None:
    """Call ``hooks.<name>(HookEvent(**fields))``, logging and swallowing its errors."""
    if hooks is None:
        return
    callback = getattr(hooks, name, None)
    if callback is None:
        return
    try:
        callback(HookEvent(**fields))
    except Exception:
        logger.exception("hook %s raised; ignored", name)
