"""Instances whose one command is an activity: the completion that closes them.

A start may record its workflow's first command itself
(:meth:`~selvedge_django.storage.starts.Starts.create_instance` with
``first_task``): the instance row, the activity's history reservation and its
queued task commit in the start's transaction, and nobody leases the instance. When
that workflow returns the activity's result (``WorkflowDefinition.result_activity``,
the built-in ``selvedge.task``), the attempt that succeeds also closes the instance,
in the transaction that records its value: the history value, the close row and the
instance's status and output commit together, as a worker would write them after
replaying the one recorded command. So an enqueued task costs two commits (its start
and its completion) plus its share of a claim batch.

The close is guarded like any fenced write, by a conditional update of the instance
row: still running, still unleased at epoch 0 (no execution ever held it, so its
history is what the start wrote) and no cancel request. Anything else (an instance a
cancel request or a failure already handed to a worker) takes the usual path: the
value arrives and the instance is woken, and the replay closes it.
"""

from __future__ import annotations

from typing import Any

from ..engine.events import (
    CLOSE_EVENT_BY_STATUS,
    CLOSE_KEY,
    CMD_CLOSE,
    EV_ACTIVITY_COMPLETED,
    HistoryRow,
)
from ..engine.ports import TaskClaim
from ..models import WorkflowStatus
from . import sql
from .db import Database
from .operation import operation
from .tasks import Tasks
from .wakeups import closed_topic

__all__ = ["SoleActivity"]


class SoleActivity:
    """The completion of an instance's only activity, closing the instance with it
    (``store.sole_activity``); the completion's statements are ``tasks``'."""

    def __init__(self, db: Database, *, tasks: Tasks) -> None:
        self.db = db
        self.tasks = tasks

    @operation
    def complete_closing(
        self, claim: TaskClaim, output: str, *, if_free: bool = False
    ) -> bool | None:
        """Record a successful attempt and close its instance with ``output`` as its result
        when the instance is still as its start left it; otherwise wake it, as
        :meth:`Tasks.complete_task` does (``if_free`` as there).

        Returns None when the claim was lost (nothing written), True when the instance
        closed as completed, False when the value arrived and the instance was woken.
        """
        complete, params = self.tasks._complete_sql(claim)
        with self.db.atomic():
            self.db._lock_instance(claim.instance_id)
            if not self.db._execute(complete, params):
                return None
            record, record_params = self.tasks._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
            self.db._execute(record, record_params)
            closed = self.db._execute(*self._close_unleased_sql(claim.instance_id, output))
            if not closed:
                self.db._wake(claim.instance_id)
                return False
            self.db._insert_row(claim.instance_id, self._close_record(output))
            self.db._closed_on_commit(claim.instance_id)
            self.db.after_commit(closed_topic(claim.instance_id))
        return True

    def _close_unleased_sql(self, instance_id: str, output: str) -> tuple[str, dict[str, Any]]:
        """The conditional close of an instance its start left unleased (CLOSE_UNLEASED),
        its values named ``close_*``."""
        return sql.CLOSE_UNLEASED, {
            "close_status": str(WorkflowStatus.COMPLETED),
            "close_output": output,
            "close_error": None,
            "close_error_type": "",
            "close_runnable": False,
            "close_at": self.db._now_param(),
            "close_instance_id": instance_id,
            "close_owner": "",
            "close_epoch": 0,
            "close_running": str(WorkflowStatus.RUNNING),
            "close_cancel_requested": False,
        }

    @staticmethod
    def _close_record(output: str) -> HistoryRow:
        """The close record of an instance completed with ``output``."""
        event = CLOSE_EVENT_BY_STATUS[WorkflowStatus.COMPLETED]
        return HistoryRow(key=CLOSE_KEY, seq=None, command=CMD_CLOSE, event_type=event, data=output)
