"""Reads for the client API, operations and the admin: one instance, one result.

Each is one statement on one instance (bounded by construction); lists an
operator pages through are :mod:`.operator_reads`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import WorkflowNotFound
from ..models import WorkflowInstance
from . import sql
from .clock import aware_utc, aware_utc_ms
from .db import Database
from .operation import operation

__all__ = ["Reads"]


class Reads:
    """Reads of one instance for the client API (``store.reads``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def get_instance(self, instance_id: str) -> WorkflowInstance:
        """The instance row; WorkflowNotFound when there is none."""
        try:
            return WorkflowInstance.objects.using(self.db.alias).get(instance_id=instance_id)
        except WorkflowInstance.DoesNotExist:
            raise WorkflowNotFound(instance_id) from None

    @operation
    def get_result_row(self, instance_id: str) -> tuple[str, str | None, str | None]:
        """An instance's (status, output, error), in one hand-written read."""
        rows = self.db._fetch(sql.SELECT_RESULT, {"instance_id": instance_id})
        if not rows:
            raise WorkflowNotFound(instance_id)
        status, output, error = rows[0]
        return str(status), output, error

    @operation
    def get_task_record_row(self, instance_id: str, key: str) -> dict[str, Any]:
        """An instance and its activity task ``key`` in one hand-written read.

        Keyed by ``TaskRecord``'s fields: the instance's ``input`` decoded, datetimes
        aware (UTC), the error envelopes as stored text; the task's fields are empty when
        it has no task under ``key`` yet. WorkflowNotFound when there is no instance.
        """
        rows = self.db._fetch(sql.SELECT_TASK_RECORD, {"key": key, "instance_id": instance_id})
        if not rows:
            raise WorkflowNotFound(instance_id)
        row: Sequence[Any] = rows[0]
        field: Any = WorkflowInstance._meta.get_field("input")
        return {
            "workflow_name": row[0],
            "status": row[1],
            "input": field.from_db_value(row[2], None, self.db.connection),
            "output": row[3],
            "error": row[4],
            "started_at": aware_utc(row[5]),
            "closed_at": None if row[6] is None else aware_utc(row[6]),
            "task_status": row[7],
            "attempts": int(row[8] or 0),
            "failures": int(row[9] or 0),
            "last_error": row[10],
            "claim_owner": row[11] or "",
            "claim_started_at": None if row[12] is None else aware_utc_ms(row[12]),
        }
