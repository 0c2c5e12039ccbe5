"""Cancel requests: durable on the instance row, read back by the execution that sees them."""

from __future__ import annotations

from .. import exceptions as exc
from ..models import WorkflowInstance, WorkflowStatus
from . import sql
from .db import Database
from .operation import operation
from .wakeups import TOPIC_RUNNABLE

__all__ = ["Cancels"]


class Cancels:
    """A cancel request and its state (``store.cancels``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def request_cancel(
        self, instance_id: str, reason: str, *, trace_context: str | None = None
    ) -> str:
        """Store a durable cancel request (the first one's ``trace_context`` with it) and
        wake the instance; return its status."""
        instances = WorkflowInstance.objects.using(self.db.alias)
        with self.db.atomic():
            status = (
                instances.filter(instance_id=instance_id)
                .select_for_update(no_key=True)
                .values_list("status", flat=True)
                .first()
            )
            if status is None:
                raise exc.WorkflowNotFound(instance_id)
            if status == WorkflowStatus.CANCELLED:
                return str(status)
            if status != WorkflowStatus.RUNNING:
                raise exc.InstanceClosed.for_status(instance_id, status)
            instances.filter(instance_id=instance_id, cancel_requested=False).update(
                cancel_requested=True, cancel_reason=reason, cancel_trace_context=trace_context
            )
            instances.filter(instance_id=instance_id).update(**self.db.wake_fields())
            self.db.after_commit(TOPIC_RUNNABLE)
            return str(status)

    @operation
    def cancel_state(self, instance_id: str) -> tuple[bool, str]:
        """(cancel requested, reason) of an instance; (False, "") when it does not exist."""
        rows = self.db._fetch(sql.SELECT_CANCEL_STATE, {"instance_id": instance_id})
        if not rows:
            return False, ""
        return bool(rows[0][0]), str(rows[0][1])
