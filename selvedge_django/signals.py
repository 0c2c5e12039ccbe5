"""Django signals for the workflow lifecycle, sent after the durable write they report.

Each is sent with ``sender`` = the workflow name and keyword arguments
``instance_id`` and ``workflow_name`` (plus ``error`` for failures and
cancellations). ``connect(receiver, sender="shop.order")`` selects one workflow
by any string equal to its name (Django's own signals match senders by
identity). Receivers that raise are logged and ignored.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from django.dispatch import Signal

__all__ = [
    "has_receivers",
    "send",
    "workflow_cancelled",
    "workflow_completed",
    "workflow_failed",
    "workflow_started",
]

logger = logging.getLogger("selvedge_django.signals")


class WorkflowSignal(Signal):
    """A signal whose string senders (workflow names) match by value, not identity.

    Django keys a receiver by ``id(sender)``: a name read from the database is a
    different object from the equal literal a project connected with. Both ends
    go through ``sys.intern``, and the interned names a receiver was connected for
    are kept alive here, so that their ids stay theirs.
    """

    def __init__(self) -> None:
        super().__init__()
        self._names: set[str] = set()
        self._names_lock = threading.Lock()

    def _canonical(self, sender: Any, *, keep: bool = False) -> Any:
        if type(sender) is not str:
            return sender
        name = sys.intern(sender)
        if keep:
            with self._names_lock:
                self._names.add(name)
        return name

    def connect(self, receiver: Any, sender: Any = None, *args: Any, **kwargs: Any) -> None:
        super().connect(receiver, self._canonical(sender, keep=True), *args, **kwargs)

    def disconnect(
        self, receiver: Any = None, sender: Any = None, *args: Any, **kwargs: Any
    ) -> bool:
        return super().disconnect(receiver, self._canonical(sender), *args, **kwargs)

    def has_listeners(self, sender: Any = None) -> bool:
        return super().has_listeners(self._canonical(sender))

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return super().send(self._canonical(sender), **named)

    def send_robust(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return super().send_robust(self._canonical(sender), **named)

    async def asend(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return await super().asend(self._canonical(sender), **named)

    async def asend_robust(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return await super().asend_robust(self._canonical(sender), **named)


workflow_started = WorkflowSignal()
workflow_completed = WorkflowSignal()
workflow_failed = WorkflowSignal()
workflow_cancelled = WorkflowSignal()

_BY_HOOK = {
    "on_workflow_started": workflow_started,
    "on_workflow_completed": workflow_completed,
    "on_workflow_failed": workflow_failed,
    "on_workflow_cancelled": workflow_cancelled,
}


def has_receivers(hook: str) -> bool:
    """Whether :func:`send` for ``hook`` may reach a receiver (one is connected)."""
    signal = _BY_HOOK.get(hook)
    return signal is not None and bool(signal.receivers)


def send(hook: str, **fields: Any) -> None:
    """Send the Django signal matching a lifecycle hook, if there is one."""
    signal = _BY_HOOK.get(hook)
    if signal is None:
        return
    workflow_name = fields.get("workflow_name", "")
    kwargs = {k: v for k, v in fields.items() if k in ("instance_id", "workflow_name", "error")}
    for receiver, result in signal.send_robust(sender=workflow_name, **kwargs):
        if isinstance(result, Exception):
            logger.error("receiver %r of %s raised %r; ignored", receiver, hook, result)
