"""Store operations for instances that cannot go on: storage-error backoff and terminate.

Mixed into :class:`selvedge_django.store.DjangoStore`; every method is one
transaction (or one statement).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from django.db import transaction

from . import exceptions as exc
from . import local_starts
from .engine.events import CLOSE_EVENT_BY_STATUS, CLOSE_KEY, CMD_CLOSE, Fence, HistoryRow
from .models import WorkflowStatus
from .store_waits import WaitStoreMixin

__all__ = ["RecoveryStoreMixin"]

# The most of an error's text kept on the instance (``execution_error``).
EXECUTION_ERROR_CHARS = 2000


class RecoveryStoreMixin(WaitStoreMixin):
    """Holding an instance back after storage errors, and closing it from outside."""

    def execution_errors(self, fence: Fence) -> int | None:
        """How many executions in a row ended on a storage error before the one ``fence``
        holds; None when that lease is no longer held (or the instance closed)."""
        rows = self._fetch(
            "SELECT execution_errors FROM {instance} WHERE instance_id = %s"
            " AND lease_owner = %s AND lease_epoch = %s AND status = %s",
            [fence.instance_id, fence.owner, fence.epoch, str(WorkflowStatus.RUNNING)],
        )
        return int(rows[0][0]) if rows else None

    def defer_execution(self, fence: Fence, errors: int, delay: float, message: str) -> bool:
        """Release the lease of an execution that ended on a storage error, and hold the
        instance back ``delay`` seconds (database clock), recording ``errors`` (the count
        in a row, this one included) and ``message``, in one fenced update.

        The instance stays runnable; dispatch takes it once ``ready_ms`` has passed,
        and nothing that arrives meanwhile (a signal, a cancel request) brings that
        forward. False when the lease was no longer held.
        """
        now = self.now_sql()
        return (
            self._execute(
                "UPDATE {instance} SET lease_owner = '', lease_expires_ms = NULL, runnable = %s,"
                f" ready_ms = {now.sql} + %s, execution_errors = %s, execution_error = %s,"
                " updated_at = %s WHERE instance_id = %s AND lease_owner = %s"
                " AND lease_epoch = %s AND status = %s",
                [
                    True,
                    *now.params,
                    round(delay * 1000),
                    errors,
                    message[:EXECUTION_ERROR_CHARS],
                    self._now_param(),
                    fence.instance_id,
                    fence.owner,
                    fence.epoch,
                    str(WorkflowStatus.RUNNING),
                ],
            )
            == 1
        )

    def terminate(
        self,
        instance_id: str,
        error: str,
        closed_by: dict[str, Any],
        *,
        fence: Fence | None = None,
    ) -> str:
        """Close a running instance as failed at once, without running its code; return
        its workflow name.

        In one transaction: the status and ``error`` (an envelope), a new lease epoch
        (an execution still running is fenced out at its next write), the close row,
        the cancellation of unfinished tasks (a running attempt loses its claim), the
        deletion of timers, cancel requests to running children and, for a child,
        the outcome in a waiting parent's history. History rows still waiting for
        a value are left as they are, and the close row records who closed the run
        (``closed_by``, in its ``reservation``): so the close row alone is what a
        resume has to archive. With ``fence``, only while that execution still holds
        the lease (a worker failing its own instance: :class:`Fenced` otherwise).
        Raises :class:`WorkflowNotFound` or :class:`InstanceClosed`.
        """
        with self.atomic():
            rows = self._fetch(
                "SELECT status, parent_instance_id, parent_key, workflow_name FROM {instance}"
                " WHERE instance_id = %s",
                [instance_id],
            )
            if not rows:
                raise exc.WorkflowNotFound(instance_id)
            status, parent_id, parent_key, workflow_name = rows[0]
            if status != WorkflowStatus.RUNNING:
                raise exc.InstanceClosed.for_status(instance_id, status)
            # Lock order: a waiting parent's row before this one, as a child's close does.
            parent = self._wake_waiting_parent(instance_id, (str(parent_id), str(parent_key)))
            now = self._now_param()
            sql = (
                "UPDATE {instance} SET status = %s, output = NULL, error = %s, lease_owner = '',"
                " lease_expires_ms = NULL, lease_epoch = lease_epoch + 1, runnable = %s,"
                " closed_at = %s, updated_at = %s WHERE instance_id = %s AND status = %s"
            )
            params: list[Any] = [
                str(WorkflowStatus.FAILED),
                error,
                False,
                now,
                now,
                instance_id,
                str(WorkflowStatus.RUNNING),
            ]
            if fence is not None:
                sql += " AND lease_owner = %s AND lease_epoch = %s"
                params += [fence.owner, fence.epoch]
            if self._execute(sql, params) != 1:
                if fence is not None:
                    raise self._fenced_error(fence)
                # Closed by its execution while this transaction waited for the row.
                closed = self._fetch(
                    "SELECT status FROM {instance} WHERE instance_id = %s", [instance_id]
                )
                raise exc.InstanceClosed.for_status(instance_id, closed[0][0])
            self._insert_row(
                instance_id,
                HistoryRow(
                    key=CLOSE_KEY,
                    seq=None,
                    command=CMD_CLOSE,
                    event_type=CLOSE_EVENT_BY_STATUS[WorkflowStatus.FAILED],
                    data=error,
                    reservation=json.dumps({"closed_by": closed_by}),
                ),
            )
            self._close_cleanup(instance_id, fill=False)
            self._close_cascade(
                instance_id, str(WorkflowStatus.FAILED), error, children=True, parent=parent
            )
            transaction.on_commit(
                functools.partial(local_starts.finished, instance_id), using=self.alias
            )
            self.after_commit(f"closed:{instance_id}")
        return str(workflow_name)
