"""Activity tasks on PostgreSQL: outcomes and reservations as one statement each.

Outside any transaction, the statements of a completion (the claim check, the
history value, the wake-up and its NOTIFY) chain as data-modifying ``WITH``
queries into one statement, and so do a reservation's (the fence, the history
row, the task and the NOTIFYs), carrying the one inline result held before it
when there is one. Inside a caller's transaction the portable path runs.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError

from ...engine.events import EV_ACTIVITY_COMPLETED, Fence, HistoryRow
from ...engine.ports import TaskClaim
from ...models import ActivityTask, ActivityTaskStatus, WorkflowStatus
from .. import sql
from ..errors import RowBusy
from ..inline import Pending
from ..operation import operation
from ..sole_activity import SoleActivity
from ..tasks import Tasks
from ..wakeups import TOPIC_RUNNABLE, TOPIC_TASK, closed_topic
from .db import PostgresDatabase
from .sql import (
    COMPLETE_CLOSING,
    COMPLETE_TASK,
    NOT_HELD_BY_LOCKED,
    RESERVE_ACTIVITY,
    RESERVE_WITH_INLINE,
)

__all__ = ["PostgresSoleActivity", "PostgresTasks"]


class PostgresTasks(Tasks):
    """Activity tasks on PostgreSQL (see the module docstring)."""

    db: PostgresDatabase

    @operation
    def complete_task(
        self,
        claim: TaskClaim,
        output: str,
        *,
        inline_fence: Fence | None = None,
        if_free: bool = False,
    ) -> bool:
        """complete_task: the claim check, the value and the wake-up, as one statement
        (also inside a group commit's transaction, which then sends the NOTIFY)."""
        if not self.db.one_statement and not if_free:
            return super().complete_task(claim, output, inline_fence=inline_fence)
        deferred = not self.db.one_statement
        claimed = self._complete_statement(
            claim, output, inline_fence, skip_locked=if_free, deferred=deferred
        )
        if claimed is None:
            raise RowBusy(claim.instance_id)
        return claimed

    def _complete_statement(
        self,
        claim: TaskClaim,
        output: str,
        inline_fence: Fence | None,
        *,
        skip_locked: bool = False,
        deferred: bool = False,
    ) -> bool | None:
        """The one-statement completion: whether the claim held (None: the instance row
        was locked and ``skip_locked`` wrote nothing). ``deferred``: inside a
        transaction, whose commit sends the wake-up."""
        complete, params = self._complete_sql(claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(
            claim, output, inline_fence
        )
        notify, notify_params = self.db.notifier.from_cte("w", [] if deferred else [TOPIC_RUNNABLE])
        statement = sql.compose(
            COMPLETE_TASK,
            complete=complete,
            record=record,
            wake=wake,
            notify=notify,
            skip=" SKIP LOCKED" if skip_locked else "",
        )
        lock = {"lock_instance_id": claim.instance_id}
        claimed, woken, _, locked = self.db._fetch(
            statement, sql.bind(lock, params, record_params, wake_params, notify_params)
        )[0]
        if skip_locked and not locked:
            return None
        if woken:
            if deferred:
                self.db.after_commit(TOPIC_RUNNABLE)
            else:
                self.db._publish_now(TOPIC_RUNNABLE)
        return bool(claimed)

    def _arrive_locked_sql(
        self, claim: TaskClaim, output: str, inline_fence: Fence | None
    ) -> tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]:
        """The two updates of a completion in a statement that locks the instance row
        first (its CTE ``i``): the history value, and the wake, whose condition on the
        inline holder reads the locked row (NOT_HELD_BY_LOCKED), not the statement's
        snapshot, which may predate a lease that changed hands meanwhile."""
        record = self._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        condition, params = "", {}
        if inline_fence is not None:
            condition = NOT_HELD_BY_LOCKED
            params = {"held_owner": inline_fence.owner, "held_epoch": inline_fence.epoch}
        return record, self.db._wake_sql(claim.instance_id, condition, params)

    def _reserve(
        self,
        fence: Fence,
        row: HistoryRow,
        fields: dict[str, Any],
        current_step: str,
        release: bool,
        uncancelled: bool = False,
    ) -> int:
        """reserve_activity: fence, history row and task in one statement.

        With ``release`` the fence update also releases the lease; dispatchers are
        woken when the instance is still runnable (input arrived meanwhile).
        """
        if not self.db.one_statement:
            return super()._reserve(fence, row, fields, current_step, release, uncancelled)
        item = None
        if self.db.has_deferred(fence):
            item = self.inline._sole_deferred(fence)
            if item is None:
                # Several results before it: they, then the reservation, in one
                # transaction, wake-ups after its commit.
                with self.db.atomic():
                    self._apply_deferred(fence)
                    return self._reserve_statement(
                        fence, row, fields, current_step, release, uncancelled, deferred=True
                    )
        return self._reserve_statement(
            fence, row, fields, current_step, release, uncancelled, carried=item
        )

    def _reserve_statement(
        self,
        fence: Fence,
        row: HistoryRow,
        fields: dict[str, Any],
        current_step: str,
        release: bool,
        uncancelled: bool,
        *,
        deferred: bool = False,
        carried: Pending | None = None,
    ) -> int:
        """The one-statement reservation; ``deferred``: inside a transaction, which sends
        the wake-ups when it commits; ``carried``: the one inline result held before it,
        recorded by the same statement.

        With a ``carried`` result nothing is reserved unless the result is recorded: a
        claim that lapsed writes nothing and raises InlineClaimLapsed (the run replays).
        A result recorded while the fence no longer matches (the lease is gone, or a
        cancel request came first for an ``uncancelled`` reservation) stays recorded,
        waking the instance's new holder if there is one, and the reservation raises
        Fenced, as it would have without the result.
        """
        queued = fields["status"] == ActivityTaskStatus.QUEUED
        fence_sql, fence_params = self.db._fence_sql(
            fence,
            current_step,
            release=release,
            uncancelled=uncancelled,
            parked=self._parked_at(row),
        )
        history_sql, history_params = self.db._history_insert_sql(fence.instance_id, row, "f")
        columns, values, task_params = self.db._insert_parts(
            ActivityTask, fields, skip_pk=True, name="task"
        )
        notify, notify_params = self.db.notifier.from_cte(
            "t", [TOPIC_TASK] if queued and not deferred else []
        )
        wake, wake_params = self.db.notifier.from_cte(
            "r", [TOPIC_RUNNABLE] if release and not deferred else []
        )
        parts = {"fence": fence_sql, "columns": columns, "values": values, "notify": notify}
        params = sql.bind(fence_params, history_params, task_params, notify_params, wake_params)
        if carried is None:
            statement = sql.compose(RESERVE_ACTIVITY, history=history_sql, wake=wake, **parts)
        else:
            carrying, carried_params = self._carried_parts(carried, fence)
            statement = sql.compose(
                RESERVE_WITH_INLINE, reserved=history_sql, wake_runnable=wake, **carrying, **parts
            )
            params = sql.bind(carried_params, params)  # in the order of the statement
        try:
            fetched = self.db._fetch(statement, params)[0]
        except IntegrityError as error:
            raise self.db._key_conflict(fence.instance_id, row.key) from error
        fenced, runnable, task_id = fetched[:3]
        if carried is not None:
            self._settle_carried(carried, fence, recorded=bool(fetched[5]), woke=bool(fetched[6]))
        if fenced != 1:
            raise self.db._fenced_error(fence)
        if deferred:
            if queued:
                self.db.after_commit(TOPIC_TASK)
            if release and runnable:
                self.db.after_commit(TOPIC_RUNNABLE)
            return int(task_id)
        if queued:
            self.db._publish_now(TOPIC_TASK)
        if release and runnable:
            self.db._publish_now(TOPIC_RUNNABLE)
        return int(task_id)

    def _record_inline(self, claim: TaskClaim, output: str, fence: Fence) -> bool:
        """The inline result in one statement: the instance row (held by ``fence``'s
        execution, so nobody is woken), the claim-checked task and the history value."""
        complete, params = self._complete_sql(claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(claim, output, fence)
        statement = sql.compose(COMPLETE_TASK, complete=complete, record=record, wake=wake, skip="")
        lock = {"lock_instance_id": claim.instance_id}
        claimed, _, _, _ = self.db._fetch(
            sql.compose(statement, notify="0"), sql.bind(lock, params, record_params, wake_params)
        )[0]
        return bool(claimed)

    def _carried_parts(
        self, carried: Pending, fence: Fence
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """The parts of a statement that carries an inline result: the claim-checked
        completion ({complete}), its history value ({record}), the wake of another holder
        ({wake}) and that wake's NOTIFY ({woken}). Returns the parts and their values
        (the instance row's lock, the three writes, the NOTIFY)."""
        complete, complete_params = self._complete_sql(carried.claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(
            carried.claim, carried.output, fence
        )
        woken, woken_params = self.db.notifier.from_cte("w", [TOPIC_RUNNABLE])
        parts = {"complete": complete, "record": record, "wake": wake, "woken": woken}
        lock = {"lock_instance_id": fence.instance_id}
        return parts, sql.bind(lock, complete_params, record_params, wake_params, woken_params)

    def _settle_carried(
        self, carried: Pending, fence: Fence, *, recorded: bool, woke: bool
    ) -> None:
        """After the statement that carried ``carried``: a lapsed claim raises
        InlineClaimLapsed (nothing was written); a woken holder hears it now."""
        self.inline._settle_deferred(carried, recorded=recorded)
        if not recorded:
            raise self.inline._lapsed(fence, carried.claim)
        if woke:
            self.db._publish_now(TOPIC_RUNNABLE)


class PostgresSoleActivity(SoleActivity):
    """The closing completion of an instance's only activity, as one statement."""

    db: PostgresDatabase

    @operation
    def complete_closing(
        self, claim: TaskClaim, output: str, *, if_free: bool = False
    ) -> bool | None:
        """complete_closing: the claim check, the value and the close (or the wake), as
        one statement that decides on the locked instance row (never ``if_free``: its
        statement waits for that row, so it is always written alone)."""
        if if_free:
            raise RowBusy(claim.instance_id)
        if not self.db.one_statement:
            return super().complete_closing(claim, output)
        iid = claim.instance_id
        complete, params = self.tasks._complete_sql(claim)
        record, record_params = self.tasks._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        close, close_params = self._close_unleased_sql(iid, output)
        row_sql, row_params = self.db._history_insert_sql(iid, self._close_record(output), "c")
        wake, wake_params = self.db._wake_sql(iid)
        topic = closed_topic(iid)
        # The close's wake-up is a waiter's hint, sent after the commit (is_waiter_hint).
        notify, notify_params = self.db.notifier.from_cte("c", [])
        woken, woken_params = self.db.notifier.from_cte("w", [TOPIC_RUNNABLE])
        statement = sql.compose(
            COMPLETE_CLOSING,
            complete=complete,
            record=record,
            close=close,
            closerow=row_sql,
            wake=wake,
            notify=notify,
            woken=woken,
        )
        lock = {"lock_instance_id": iid, "lock_running": str(WorkflowStatus.RUNNING)}
        values = sql.bind(
            lock, params, record_params, close_params, row_params, wake_params, notify_params
        )
        claimed, closed, woke, _, _ = self.db._fetch(statement, sql.bind(values, woken_params))[0]
        if not claimed:
            return None
        if closed:
            self.db._closed(iid)
            self.db.after_commit(topic)
            return True
        if woke:
            self.db._publish_now(TOPIC_RUNNABLE)
        return False
