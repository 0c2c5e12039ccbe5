"""The leader's sweep of runs past their execution timeout: each is terminated.

A run started with ``execution_timeout`` has a deadline on the database clock
(``execution_deadline_ms``, NULL otherwise; a partial index over running
instances that have one is what the sweep reads). Each overdue run is closed by
:meth:`~.instances.Instances.terminate` in its own transaction, guarded by
the deadline still being past, with the reason ``"execution timeout"``; rows
another transaction holds are skipped (not waited for) and handled at the next
round, like the activity timeout sweeps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError

from .. import exceptions as exc
from ..engine.events import error_data
from ..models import WorkflowInstance, WorkflowStatus
from . import sql
from .db import Database
from .instances import Instances
from .operation import operation

__all__ = ["EXECUTION_TIMEOUT_REASON", "ExecutionTimeouts", "TimedOutRun"]

#: The reason of the :class:`~selvedge_django.exceptions.WorkflowTerminated` error of a
#: run that outlived its execution timeout.
EXECUTION_TIMEOUT_REASON = "execution timeout"

logger = logging.getLogger("selvedge_django.store")


@dataclass(frozen=True)
class TimedOutRun:
    """A run the sweep terminated: its id, workflow, and the error it closed with."""

    instance_id: str
    workflow_name: str
    error: exc.WorkflowTerminated


class ExecutionTimeouts:
    """Terminate the running instances whose execution deadline has passed
    (``store.execution_timeouts``), through ``instances``."""

    def __init__(self, db: Database, *, instances: Instances) -> None:
        self.db = db
        self.instances = instances

    @operation
    def sweep_execution_timeouts(self, limit: int) -> list[TimedOutRun]:
        """Terminate up to ``limit`` running instances past their execution deadline,
        the longest overdue first, each in its own transaction; return them.

        Each close is :meth:`Instances.terminate`'s (a new lease epoch, unfinished tasks
        cancelled, timers deleted, running children asked to cancel, a waiting
        parent given the failure) with :class:`WorkflowTerminated` and the reason
        ``"execution timeout"``; the close row records the timeout and the
        deadline. An instance (or its parent) whose row another transaction
        holds waits for the next round; one that closed, or got a new deadline,
        meanwhile is left alone; one whose transaction fails is rolled back,
        logged and swept again next round, after the others of the batch.
        """
        overdue = list(
            WorkflowInstance.objects.using(self.db.alias)
            .filter(
                status=WorkflowStatus.RUNNING,
                execution_deadline_ms__isnull=False,
                execution_deadline_ms__lt=self.db.now_expr(),
            )
            .order_by("execution_deadline_ms")
            .values_list("instance_id", "execution_timeout_ms", "execution_deadline_ms")[:limit]
        )
        closed: list[TimedOutRun] = []
        for instance_id, timeout_ms, deadline_ms in overdue:
            error = exc.WorkflowTerminated(instance_id, EXECUTION_TIMEOUT_REASON)
            closed_by = {
                "execution_timeout": {"timeout_ms": timeout_ms, "deadline_ms": deadline_ms}
            }
            try:
                with self.db.atomic():
                    if not self._lock_family(instance_id):
                        continue
                    name = self.instances.terminate(
                        instance_id,
                        error_data(error, codec=self.db.codec),
                        closed_by,
                        overdue=True,
                    )
            except (exc.InstanceClosed, exc.WorkflowNotFound, exc.InvalidWorkflowState):
                continue
            except DatabaseError:
                # Rolled back: this instance is swept again next round, and one that
                # keeps failing does not hold back the others.
                logger.warning(
                    "could not terminate %s past its execution timeout",
                    instance_id,
                    exc_info=True,
                    extra={"instance_id": instance_id},
                )
                continue
            closed.append(TimedOutRun(instance_id, name, error))
        return closed

    def _lock_family(self, instance_id: str) -> bool:
        """Lock the parent's row (if any) and then the instance's, in the lock order of
        a close, unless another transaction holds one of them (False)."""
        rows = self.db._fetch(sql.SELECT_PARENT, {"instance_id": instance_id})
        if not rows:
            return False
        parent_id = str(rows[0][0])
        if parent_id and not self.db._lock_instance(parent_id, skip_locked=True):
            return False
        return self.db._lock_instance(instance_id, skip_locked=True)
