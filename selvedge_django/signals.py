"""Django signals for the workflow lifecycle, sent after the durable write they report.

Each is sent with ``sender`` = the workflow name and keyword arguments
``instance_id`` and ``workflow_name`` (plus ``error`` for failures and
cancellations). Receivers that raise are logged and ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

__all__ = [
    "send",
    "workflow_cancelled",
    "workflow_completed",
    "workflow_failed",
    "workflow_started",
]

logger = logging.getLogger("selvedge_django.signals")

workflow_started = Signal()
workflow_completed = Signal()
workflow_failed = Signal()
workflow_cancelled = Signal()

_BY_HOOK = {
    "on_workflow_started": workflow_started,
    "on_workflow_completed": workflow_completed,
    "on_workflow_failed": workflow_failed,
    "on_workflow_cancelled": workflow_cancelled,
}


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
