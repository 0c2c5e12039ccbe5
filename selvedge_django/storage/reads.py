"""Reads for the client API, operations and the admin: one instance, one result.

Each is one statement on one instance (bounded by construction); lists an
operator pages through are the operations layer's.
"""

from __future__ import annotations

from ..exceptions import WorkflowNotFound
from ..models import WorkflowInstance
from . import sql
from .base import StoreBase, operation

__all__ = ["ReadStore"]


class ReadStore(StoreBase):
    """Reads of one instance for the client API."""

    @operation
    def get_instance(self, instance_id: str) -> WorkflowInstance:
        """The instance row; WorkflowNotFound when there is none."""
        try:
            return WorkflowInstance.objects.using(self.alias).get(instance_id=instance_id)
        except WorkflowInstance.DoesNotExist:
            raise WorkflowNotFound(instance_id) from None

    @operation
    def get_result_row(self, instance_id: str) -> tuple[str, str | None, str | None]:
        """An instance's (status, output, error), in one hand-written read."""
        rows = self._fetch(sql.SELECT_RESULT, [instance_id])
        if not rows:
            raise WorkflowNotFound(instance_id)
        status, output, error = rows[0]
        return str(status), output, error
