"""Child instances, and what a close does to the family: children, parent, tasks, timers.

Every method runs inside the caller's transaction (a child start is its own
fenced transaction). Lock order: an ancestor's row before a descendant's.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Subquery
from django.db.models.expressions import RawSQL
from django.utils import timezone

from .. import exceptions as exc
from ..engine.events import (
    CMD_CHILD,
    CMD_SLEEP,
    EV_ACTIVITY_CANCELLED,
    EV_CHILD_CANCELLED,
    EV_CHILD_COMPLETED,
    EV_CHILD_FAILED,
    EV_CHILD_START_FAILED,
    EV_TIMER_CANCELLED,
    Fence,
    HistoryRow,
    error_data,
)
from ..engine.ports import ChildSpec
from ..models import (
    ActivityTask,
    ActivityTaskStatus,
    HistoryEvent,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from . import sql
from .db import Database
from .operation import operation
from .options import StoreOptions
from .sql import Sql
from .wakeups import TOPIC_RUNNABLE

__all__ = ["Children"]


class Children:
    """Child starts, cancel requests to children, and the cascade of a close
    (``store.children``)."""

    def __init__(self, db: Database, options: StoreOptions) -> None:
        self.db = db
        self.options = options

    def _next_seq_sql(self, offset: int = 0) -> Sql:
        """The next creation number of an instance as a SQL value. ``offset`` is the row's
        place in a multi-row insert: SQLite reads its number once per statement, a
        PostgreSQL sequence gives each row its own."""
        text = self.db._tables(self.db.NEXT_SEQ)
        if offset and self.db.single_writer:
            return Sql(f"({text} + %s)", [offset])
        return Sql(text)

    @operation
    def start_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow:
        """Record the child command and insert the child, in one fenced transaction.

        A child id that is taken records the start's failure in the command's row.
        """
        with self.db.atomic():
            self.db._fence(fence, current_step=f"child {child.workflow_name} {child.instance_id}")
            stored = self.db._insert_row(fence.instance_id, row)
            if stored is not row:
                return stored
            now = timezone.now()
            try:
                with transaction.atomic(using=self.db.alias):
                    WorkflowInstance.objects.using(self.db.alias).create(
                        instance_id=child.instance_id,
                        workflow_name=child.workflow_name,
                        input=child.input,
                        status=WorkflowStatus.RUNNING,
                        runnable=True,
                        ready_ms=self.db.now_expr(),
                        created_seq=RawSQL(self._next_seq_sql().sql, []),
                        parent_instance_id=fence.instance_id,
                        parent_key=row.key,
                        parent_generation=child.parent_generation,
                        # The child's spans join its parent's trace.
                        trace_context=Subquery(
                            WorkflowInstance.objects.using(self.db.alias)
                            .filter(instance_id=fence.instance_id)
                            .values("trace_context")[:1]
                        ),
                        started_at=now,
                        updated_at=now,
                        code_version=self.options.code_version,
                        execution_timeout_ms=child.execution_timeout_ms,
                        execution_deadline_ms=(
                            None
                            if child.execution_timeout_ms is None
                            else self.db.now_expr(child.execution_timeout_ms / 1000)
                        ),
                    )
            except IntegrityError:
                attached = self._reattach_child(fence, row, child)
                if attached is not None:
                    return attached
                data = error_data(exc.WorkflowAlreadyStarted(child.instance_id))
                HistoryEvent.objects.using(self.db.alias).filter(
                    instance_id=fence.instance_id, key=row.key
                ).update(event_type=EV_CHILD_START_FAILED, data=data, delivered_seq=row.seq)
                stored = HistoryRow(
                    row.key,
                    row.seq,
                    row.command,
                    EV_CHILD_START_FAILED,
                    data,
                    row.reservation,
                    row.seq,
                )
            else:
                self.db.after_commit(TOPIC_RUNNABLE)
            return stored

    def _reattach_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow | None:
        """A child start whose id is taken by this very child: re-attach to it.

        A resumed (or re-run) parent starts again, under the same key, a child it
        started in an archived part of its history. When the existing instance is
        that child (this parent, this key, the same workflow), its outcome is the
        command's: a closed child's arrives now (recorded, undelivered, the parent
        woken), a running child's arrives at its close, as for any child. None when
        the id belongs to another instance, or to a child an earlier history of this
        parent started (before a continue-as-new): that one is not the command's.
        """
        found = (
            WorkflowInstance.objects.using(self.db.alias)
            .filter(
                instance_id=child.instance_id,
                parent_instance_id=fence.instance_id,
                parent_key=row.key,
                parent_generation=child.parent_generation,
                workflow_name=child.workflow_name,
            )
            .values_list("status", "output", "error")
            .first()
        )
        if found is None:
            return None
        status, output, error = found
        if status == WorkflowStatus.RUNNING:
            return row
        event = {
            WorkflowStatus.COMPLETED: EV_CHILD_COMPLETED,
            WorkflowStatus.FAILED: EV_CHILD_FAILED,
            WorkflowStatus.CANCELLED: EV_CHILD_CANCELLED,
        }[WorkflowStatus(status)]
        data = output if status == WorkflowStatus.COMPLETED else error
        HistoryEvent.objects.using(self.db.alias).filter(
            instance_id=fence.instance_id, key=row.key, data__isnull=True
        ).update(event_type=event, data=data, arrived_at=timezone.now())
        wake = self.db.wake_sql()
        self.db._execute(sql.WAKE_INSTANCE, [*wake.params, fence.instance_id])
        # An arrival, as a child closing now would make it: the next wait delivers it.
        return row

    def _request_child_cancel(
        self, parent_id: str, children: list[tuple[str, str]], reason: str
    ) -> None:
        """Ask running children of ``parent_id`` to cancel; each is (child id, parent key).

        The parent and key conditions make sure that only an instance this parent
        created from that command is reached: an id the parent named but never
        created (a cancelled scope, a failed duplicate start) may belong to anyone.
        """
        if not children:
            return
        for part in self.db._chunks(children, values_each=2):
            mine = WorkflowInstance.objects.using(self.db.alias).filter(
                instance_id__in=[child_id for child_id, _ in part],
                parent_instance_id=parent_id,
                parent_key__in=[key for _, key in part],
                status=WorkflowStatus.RUNNING,
            )
            mine.filter(cancel_requested=False).update(cancel_requested=True, cancel_reason=reason)
            mine.update(**self.db.wake_fields())
        self.db.after_commit(TOPIC_RUNNABLE)

    def _wake_waiting_parent(
        self, iid: str, parent: tuple[str, str] | None
    ) -> tuple[str, str] | None:
        """The first statement of a child's close: lock the parent's row and wake it.

        Only a running parent whose child command still waits for an outcome is
        woken (and so locked until this close commits, so it cannot close meanwhile);
        its (id, key) is returned for :meth:`_close_cascade` to fill. None when there
        is no parent, or it closed (a parent's history never changes after its
        close: the child's outcome stays in the child's own record), or it already
        has the outcome (a cancelled scope resolved it), or a continue-as-new closed
        the history that started the child since (the outcome stays in the child's
        record; the parent's archived row is kept as it was). ``parent`` is (id, key)
        when known, None to read it.
        """
        if parent is None:
            rows = self.db._fetch(sql.SELECT_PARENT, [iid])
            parent = (str(rows[0][0]), str(rows[0][1])) if rows else ("", "")
        parent_id, parent_key = parent
        if not parent_id:
            return None
        if not self.db._wake(parent_id, sql.PARENT_WAITS, [parent_id, parent_key, CMD_CHILD, iid]):
            return None
        return parent_id, parent_key

    def _running_children(self, iid: str) -> list[tuple[str, str]]:
        """(child id, parent key) of the running children of ``iid``, every history's."""
        # The partial index's own condition, repeated, and the status checked here:
        # otherwise SQLite scans every running instance through the status index.
        return [
            (child_id, key)
            for child_id, key, child_status in WorkflowInstance.objects.using(self.db.alias)
            .filter(parent_instance_id=iid)
            .exclude(parent_instance_id="")
            .order_by()
            .values_list("instance_id", "parent_key", "status")
            if child_status == WorkflowStatus.RUNNING
        ]

    def _close_cascade(
        self,
        iid: str,
        status: str,
        data: str | None,
        *,
        children: bool = True,
        parent: tuple[str, str] | None = None,
    ) -> None:
        """What a close does to children and the parent (inside the close transaction).

        ``children`` False skips the child lookup (the history started none);
        ``parent`` is the (parent id, parent key) that :meth:`_wake_waiting_parent`
        locked and woke, whose child row gets this close's outcome; None: nothing
        to fill.
        """
        if children:
            self._request_child_cancel(iid, self._running_children(iid), f"parent {iid} closed")
        if parent is None:
            return
        parent_id, parent_key = parent
        event = {
            WorkflowStatus.COMPLETED: EV_CHILD_COMPLETED,
            WorkflowStatus.FAILED: EV_CHILD_FAILED,
            WorkflowStatus.CANCELLED: EV_CHILD_CANCELLED,
        }[WorkflowStatus(status)]
        HistoryEvent.objects.using(self.db.alias).filter(
            instance_id=parent_id, key=parent_key, command=CMD_CHILD, data__isnull=True
        ).update(event_type=event, data=data, arrived_at=timezone.now())

    def _close_cleanup(self, iid: str, *, fill: bool = True) -> None:
        """Cancel unfinished tasks and timers of a closing instance.

        With ``fill`` the history rows of unfinished activities and sleeps get a
        cancellation as their value (the workflow code closed without them); a
        terminate leaves them as they are.
        """
        ActivityTask.objects.using(self.db.alias).filter(instance_id=iid).unfinished().update(
            status=ActivityTaskStatus.CANCELLED, claim_owner="", claim_expires_ms=None
        )
        if not fill:
            TimerSubscription.objects.using(self.db.alias).filter(instance_id=iid).delete()
            return
        closed = error_data(exc.Cancelled("workflow closed before it finished"))
        unfinished = HistoryEvent.objects.using(self.db.alias).filter(
            instance_id=iid, data__isnull=True
        )
        unfinished.filter(command="activity").update(event_type=EV_ACTIVITY_CANCELLED, data=closed)
        unfinished.filter(command=CMD_SLEEP).update(event_type=EV_TIMER_CANCELLED, data=closed)
        TimerSubscription.objects.using(self.db.alias).filter(instance_id=iid).delete()
