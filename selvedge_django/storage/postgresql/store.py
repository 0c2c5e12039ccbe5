"""The PostgreSQL store: row locks, SKIP LOCKED, NOTIFY and one-statement writes.

Only what differs from the portable :class:`~selvedge_django.storage.store.DjangoStore`:

* candidates are locked with ``FOR UPDATE SKIP LOCKED`` (dispatch, claims,
  renewals, timer fires), so concurrent workers take different rows and nobody
  waits for a row another transaction holds;
* arrivals lock the instance row first (``FOR NO KEY UPDATE``), the lock order
  of every write path;
* wake-ups reach other processes through ``NOTIFY`` (skipped while the
  notification queue is half full), sent in the writing transaction;
* outside any transaction, the statements of a durable step chain as
  data-modifying ``WITH`` queries into one statement, which is a transaction by
  itself: the same all-or-nothing and the same fence, in one round trip instead
  of a BEGIN, each statement and a COMMIT. Inside a caller's transaction the
  portable path runs.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError

from ...engine.events import CLOSE_KEY, EV_ACTIVITY_COMPLETED, Fence, HistoryRow
from ...engine.ports import CloseRequest, TaskClaim, TaskSpec
from ...models import ActivityTask, ActivityTaskStatus, WorkflowStatus
from .. import sql
from ..inline import Pending
from ..operation import operation
from ..wakeups import (
    TOPIC_RUNNABLE,
    TOPIC_TASK,
    closed_topic,
)
from .db import PostgresDatabase
from .inbox import PostgresInbox
from .sql import (
    CLOSE,
    CLOSE_WITH_INLINE,
    COMPLETE_CLOSING,
    COMPLETE_TASK,
    DUE_TIMERS_LOCK,
    LEASE_BATCH,
    NOT_HELD_BY_LOCKED,
    RESERVE_ACTIVITY,
    RESERVE_WITH_INLINE,
    START_WITH_TASK,
)

__all__ = ["PostgresStore"]

logger = logging.getLogger("selvedge_django.store")


class PostgresStore(PostgresInbox):
    """The store on PostgreSQL."""

    database = PostgresDatabase
    db: PostgresDatabase

    DUE_TIMERS_LOCK = DUE_TIMERS_LOCK
    CLAIM_LOCK = " FOR UPDATE SKIP LOCKED"

    # -- dispatch and renewals ------------------------------------------------------------

    def _lease_rows(
        self, owner: str, limit: int, named: str, where: list[Any], lease_params: list[Any]
    ) -> list[tuple[Any, ...]]:
        # One statement (atomic in autocommit): each part locks what it picks.
        statement = sql.compose(
            LEASE_BATCH,
            expired=sql.compose(sql.DISPATCH_EXPIRED, named=named),
            ready=sql.compose(sql.DISPATCH_READY, named=named),
        )
        return self._fetch(statement, [*where, limit, *where, limit, limit, *lease_params])

    # -- one-statement writes -------------------------------------------------------------

    def _insert_instance(self, params: list[Any], leased: bool) -> bool:
        if leased and self._one_statement:
            # Nobody to wake: one statement.
            return self._execute(self._insert_instance_sql(), params) == 1
        return super()._insert_instance(params, leased)

    def _insert_with_task(
        self, instance_id: str, params: list[Any], row: HistoryRow, task: TaskSpec
    ) -> bool:
        """The start, its first command's row and its queued task as one statement."""
        if not self._one_statement:
            return super()._insert_with_task(instance_id, params, row, task)
        row_sql, row_params = self._history_insert_sql(instance_id, row, "i")
        notify, notify_params = self.db._notify_from("i", [TOPIC_TASK])
        statement = sql.compose(
            START_WITH_TASK,
            start=self._insert_instance_sql(),
            row=row_sql,
            queued=sql.compose(sql.INSERT_QUEUED_TASK, source=" FROM i"),
            notify=notify,
        )
        task_params = self._queued_task_params(instance_id, row, task)
        fetched = self._fetch(statement, [*params, *row_params, *task_params, *notify_params])
        inserted = fetched[0][0]
        if not inserted:
            return False
        self._publish_now(TOPIC_TASK)
        return True

    @operation
    def complete_task(
        self,
        claim: TaskClaim,
        output: str,
        *,
        inline_fence: Fence | None = None,
    ) -> bool:
        """complete_task: the claim check, the value and the wake-up, as one statement."""
        if not self._one_statement:
            return super().complete_task(claim, output, inline_fence=inline_fence)
        complete, params = self._complete_sql(claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(
            claim, output, inline_fence
        )
        notify, notify_params = self.db._notify_from("w", [TOPIC_RUNNABLE])
        statement = sql.compose(
            COMPLETE_TASK, complete=complete, record=record, wake=wake, notify=notify
        )
        claimed, woken, _ = self._fetch(
            statement,
            [claim.instance_id, *params, *record_params, *wake_params, *notify_params],
        )[0]
        if woken:
            self._publish_now(TOPIC_RUNNABLE)
        return bool(claimed)

    @operation
    def complete_closing(self, claim: TaskClaim, output: str) -> bool | None:
        """complete_closing: the claim check, the value and the close (or the wake), as
        one statement that decides on the locked instance row."""
        if not self._one_statement:
            return super().complete_closing(claim, output)
        iid = claim.instance_id
        complete, params = self._complete_sql(claim)
        record, record_params = self._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        close, close_params = self._close_unleased_sql(iid, output)
        row_sql, row_params = self._history_insert_sql(iid, self._close_record(output), "c")
        wake, wake_params = self._wake_sql(iid)
        topic = closed_topic(iid)
        notify, notify_params = self.db._notify_from("c", [topic])
        woken, woken_params = self.db._notify_from("w", [TOPIC_RUNNABLE])
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
        claimed, closed, woke, _, _ = self._fetch(
            statement,
            [
                iid,
                *params,
                *record_params,
                str(WorkflowStatus.RUNNING),
                *close_params,
                *row_params,
                *wake_params,
                *notify_params,
                *woken_params,
            ],
        )[0]
        if not claimed:
            return None
        if closed:
            self._closed(iid)
            self._publish_now(topic)
            return True
        if woke:
            self._publish_now(TOPIC_RUNNABLE)
        return False

    def _arrive_locked_sql(
        self, claim: TaskClaim, output: str, inline_fence: Fence | None
    ) -> tuple[tuple[str, list[Any]], tuple[str, list[Any]]]:
        """The two updates of a completion in a statement that locks the instance row
        first (its CTE ``i``): the history value, and the wake, whose condition on the
        inline holder reads the locked row (NOT_HELD_BY_LOCKED), not the statement's
        snapshot, which may predate a lease that changed hands meanwhile."""
        record = self._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        condition, params = "", []
        if inline_fence is not None:
            condition, params = NOT_HELD_BY_LOCKED, [inline_fence.owner, inline_fence.epoch]
        wake, wake_params = self._wake_sql(claim.instance_id, condition)
        return record, (wake, [*wake_params, *params])

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
        if not self._one_statement:
            return super()._reserve(fence, row, fields, current_step, release, uncancelled)
        item = None
        if self.has_deferred(fence):
            item = self._sole_deferred(fence)
            if item is None:
                # Several results before it: they, then the reservation, in one
                # transaction, wake-ups after its commit.
                with self.atomic():
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
        fence_sql, fence_params = self._fence_sql(
            fence, current_step, release=release, uncancelled=uncancelled
        )
        history_sql, history_params = self._history_insert_sql(fence.instance_id, row, "f")
        columns, values, task_params = self._insert_parts(ActivityTask, fields, skip_pk=True)
        notify, notify_params = self.db._notify_from(
            "t", [TOPIC_TASK] if queued and not deferred else []
        )
        wake, wake_params = self.db._notify_from(
            "r", [TOPIC_RUNNABLE] if release and not deferred else []
        )
        parts = {"fence": fence_sql, "columns": columns, "values": values, "notify": notify}
        params = [*fence_params, *history_params, *task_params, *notify_params, *wake_params]
        if carried is None:
            statement = sql.compose(RESERVE_ACTIVITY, history=history_sql, wake=wake, **parts)
        else:
            carrying, leading, woken_params = self._carried_parts(carried, fence)
            statement = sql.compose(
                RESERVE_WITH_INLINE, reserved=history_sql, wake_runnable=wake, **carrying, **parts
            )
            params = [*leading, *fence_params, *history_params, *task_params, *notify_params]
            params += [*wake_params, *woken_params]
        try:
            fetched = self._fetch(statement, params)[0]
        except IntegrityError as error:
            raise self._key_conflict(fence.instance_id, row.key) from error
        fenced, runnable, task_id = fetched[:3]
        if carried is not None:
            self._settle_carried(carried, fence, recorded=bool(fetched[5]), woke=bool(fetched[6]))
        if fenced != 1:
            raise self._fenced_error(fence)
        if deferred:
            if queued:
                self.after_commit(TOPIC_TASK)
            if release and runnable:
                self.after_commit(TOPIC_RUNNABLE)
            return int(task_id)
        if queued:
            self._publish_now(TOPIC_TASK)
        if release and runnable:
            self._publish_now(TOPIC_RUNNABLE)
        return int(task_id)

    def _record_inline(self, claim: TaskClaim, output: str, fence: Fence) -> bool:
        """The inline result in one statement: the instance row (held by ``fence``'s
        execution, so nobody is woken), the claim-checked task and the history value."""
        complete, params = self._complete_sql(claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(claim, output, fence)
        statement = sql.compose(COMPLETE_TASK, complete=complete, record=record, wake=wake)
        claimed, _, _ = self._fetch(
            sql.compose(statement, notify="0"),
            [claim.instance_id, *params, *record_params, *wake_params],
        )[0]
        return bool(claimed)

    @operation
    def close(self, fence: Fence, request: CloseRequest) -> str:
        """close: for the common case (nothing left to clean up, no parent, no children,
        not a cancellation) the fenced update, the close record and the NOTIFY in one
        statement."""
        if not (
            self._one_statement
            and request.status != WorkflowStatus.CANCELLED
            and not request.unfinished
            and not request.children
            and request.parent is not None
            and not request.parent[0]
        ):
            return super().close(fence, request)
        if self.has_deferred(fence):
            item = self._sole_deferred(fence)
            if item is not None and not self.connection.in_atomic_block:
                return self._close_with_inline(fence, request, item)
            # The inline result before it, then the close: one transaction, two statements.
            with self.atomic():
                self._apply_deferred(fence)
                return self._close_statement(fence, request, deferred=True)
        return self._close_statement(fence, request)

    def _close_statement(
        self, fence: Fence, request: CloseRequest, *, deferred: bool = False
    ) -> str:
        """The one-statement close; ``deferred``: inside a transaction, whose commit sends
        the wake-up."""
        status = request.status
        data = request.output if status == WorkflowStatus.COMPLETED else request.error
        close_sql, close_params = self._close_sql(fence, status, request)
        row_sql, row_params = self._history_insert_sql(
            fence.instance_id, self._close_row(status, data), "c"
        )
        topic = closed_topic(fence.instance_id)
        notify, notify_params = self.db._notify_from("c", [] if deferred else [topic])
        statement = sql.compose(CLOSE, close=close_sql, history=row_sql, notify=notify)
        try:
            closed, _ = self._fetch(statement, [*close_params, *row_params, *notify_params])[0]
        except IntegrityError as error:
            raise self._key_conflict(fence.instance_id, CLOSE_KEY) from error
        if closed != 1:
            raise self._fenced_error(fence)
        if deferred:
            self._closed_on_commit(fence.instance_id)
            self.after_commit(topic)
            return str(status)
        self._closed(fence.instance_id)
        self._publish_now(topic)
        return str(status)

    def _carried_parts(
        self, carried: Pending, fence: Fence
    ) -> tuple[dict[str, str], list[Any], list[Any]]:
        """The parts of a statement that carries an inline result: the claim-checked
        completion ({complete}), its history value ({record}), the wake of another holder
        ({wake}) and that wake's NOTIFY ({woken}). Returns the parts, the leading
        parameters (the instance row's lock, then the three writes) and the NOTIFY's,
        which come last."""
        complete, complete_params = self._complete_sql(carried.claim)
        (record, record_params), (wake, wake_params) = self._arrive_locked_sql(
            carried.claim, carried.output, fence
        )
        woken, woken_params = self.db._notify_from("w", [TOPIC_RUNNABLE])
        parts = {"complete": complete, "record": record, "wake": wake, "woken": woken}
        leading = [fence.instance_id, *complete_params, *record_params, *wake_params]
        return parts, leading, woken_params

    def _settle_carried(
        self, carried: Pending, fence: Fence, *, recorded: bool, woke: bool
    ) -> None:
        """After the statement that carried ``carried``: a lapsed claim raises
        InlineClaimLapsed (nothing was written); a woken holder hears it now."""
        self._settle_deferred(carried, recorded=recorded)
        if not recorded:
            raise self._lapsed(fence, carried.claim)
        if woke:
            self._publish_now(TOPIC_RUNNABLE)

    def _close_with_inline(self, fence: Fence, request: CloseRequest, item: Pending) -> str:
        """The close and the one inline result it carries, in one statement.

        Nothing is closed unless the result is recorded: a claim that lapsed writes
        nothing and raises InlineClaimLapsed (the run replays), as the two-statement
        transaction does. A result recorded while the fence no longer holds stays
        recorded (its claim was live) and wakes the instance's new holder, and the close
        raises Fenced: an outcome recorded as a background attempt records its own.
        """
        status = request.status
        data = request.output if status == WorkflowStatus.COMPLETED else request.error
        carrying, leading, woken_params = self._carried_parts(item, fence)
        close_sql, close_params = self._close_sql(fence, status, request)
        row_sql, row_params = self._history_insert_sql(
            fence.instance_id, self._close_row(status, data), "c"
        )
        topic = closed_topic(fence.instance_id)
        notify, notify_params = self.db._notify_from("c", [topic])
        statement = sql.compose(
            CLOSE_WITH_INLINE, close=close_sql, closerow=row_sql, notify=notify, **carrying
        )
        params = [*leading, *close_params, *row_params, *notify_params, *woken_params]
        try:
            claimed, closed, woke, _, _ = self._fetch(statement, params)[0]
        except IntegrityError as error:
            raise self._key_conflict(fence.instance_id, CLOSE_KEY) from error
        self._settle_carried(item, fence, recorded=bool(claimed), woke=bool(woke))
        if closed != 1:
            raise self._fenced_error(fence)
        self._closed(fence.instance_id)
        self._publish_now(topic)
        return str(status)
