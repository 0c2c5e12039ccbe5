"""``task_finished``, sent once a task's outcome is committed.

The worker (or the client that terminated the run) sends selvedge's own
``workflow_completed`` / ``workflow_failed`` / ``workflow_cancelled`` after the
close commits; for the built-in ``selvedge.task`` workflow this module answers
with ``django.tasks``' ``task_finished``, carrying the ``TaskResult`` read from the
database as it now stands, so a receiver that reads the result again sees the
same finished state. Nothing here imports ``django.tasks`` until a task closes.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import signals
from .names import TASK_KEY, TASK_WORKFLOW

__all__ = ["connect"]

logger = logging.getLogger("selvedge_django.tasks")


def _task_closed(sender: str, instance_id: str, **kwargs: Any) -> None:
    if sender != TASK_WORKFLOW:
        return
    from ..operations.task_records import task_record
    from . import compat
    from .backend import SelvedgeBackend
    from .results import build_result, load_task

    record = task_record(instance_id, TASK_KEY)
    try:
        task = load_task(record.input if isinstance(record.input, dict) else {})
    except (KeyError, ValueError) as error:
        # The path names no task this process knows (code changed since enqueue, or a
        # module the worker does not import): the attempt failed for that reason.
        logger.warning("task_finished not sent for %s: %s", instance_id, error)
        return
    compat.task_finished.send(sender=SelvedgeBackend, task_result=build_result(task, record))


def connect() -> None:
    """Send ``task_finished`` after each close of a ``selvedge.task`` instance."""
    for signal in (signals.workflow_completed, signals.workflow_failed, signals.workflow_cancelled):
        signal.connect(
            _task_closed, sender=TASK_WORKFLOW, weak=False, dispatch_uid="selvedge.task_finished"
        )
