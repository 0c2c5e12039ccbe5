"""The PostgreSQL store: row locks, SKIP LOCKED, NOTIFY and one-statement writes.

Only what differs from the portable parts of :class:`~selvedge_django.storage.store.Store`:

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
  portable path runs, except for a task's enqueue (one statement in a savepoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError

from ...engine.attributes import AttributeValue
from ...engine.events import CLOSE_KEY, Fence, HistoryRow
from ...engine.ports import CloseRequest, TaskSpec
from ...models import WorkflowStatus
from .. import sql
from ..inline import Pending
from ..instances import Instances
from ..operation import operation
from ..starts import Starts
from ..store import Store
from ..wakeups import TOPIC_RUNNABLE, TOPIC_TASK, closed_topic
from .bulk_starts import PostgresBulkStarts
from .db import PostgresDatabase
from .inbox import PostgresWaits
from .sql import (
    CLOSE,
    CLOSE_WITH_INLINE,
    LEASE_BATCH,
    START_ATTRIBUTE_ROW,
    START_NOTIFYING,
    START_WITH_ATTRIBUTES,
    START_WITH_TASK,
)
from .streams import PostgresStreams
from .tasks import PostgresSoleActivity, PostgresTasks

__all__ = ["PostgresInstances", "PostgresStarts", "PostgresStore"]


class PostgresStarts(Starts):
    """Starts on PostgreSQL: a start with its first task, or its attributes, as one statement."""

    db: PostgresDatabase

    def _insert_instance(self, params: dict[str, Any], leased: bool) -> bool:
        """Outside a transaction one statement (one round trip, no BEGIN and COMMIT):
        the insert, with the dispatchers' NOTIFY unless this process's worker runs the
        start itself; inside a caller's transaction, the portable path."""
        if not self.db.one_statement:
            return super()._insert_instance(params, leased)
        if leased:  # nobody to wake
            return self.db._execute(self._insert_instance_sql(), params) == 1
        notify, notify_params = self.db.notifier.from_cte("i", [TOPIC_RUNNABLE])
        statement = sql.compose(START_NOTIFYING, start=self._insert_instance_sql(), notify=notify)
        if not self.db._fetch(statement, sql.bind(params, notify_params))[0][0]:
            return False
        self.db._publish_now(TOPIC_RUNNABLE)
        return True

    def _insert_with_attributes(
        self,
        instance_id: str,
        params: dict[str, Any],
        leased: bool,
        attributes: Mapping[str, AttributeValue | None],
    ) -> bool:
        """The start and its attribute rows as one statement (one round trip, no BEGIN
        and COMMIT); inside a caller's transaction, the portable two statements."""
        rows, row_params = self.attributes._rows(None, attributes, START_ATTRIBUTE_ROW)
        if not self.db.one_statement or not rows:
            return super()._insert_with_attributes(instance_id, params, leased, attributes)
        topics = [] if leased else [TOPIC_RUNNABLE]
        notify, notify_params = self.db.notifier.from_cte("i", topics)
        # The attribute rows' values by name too (attr_0, ...): one statement binds one way.
        values, value_params = sql.Sql(", ".join(rows), row_params).named("attr")
        statement = sql.compose(
            START_WITH_ATTRIBUTES,
            start=self._insert_instance_sql(),
            rows=values,
            notify=notify,
        )
        fetched = self.db._fetch(statement, sql.bind(params, value_params, notify_params))
        if not fetched[0][0]:
            return False
        if topics:
            self.db._publish_now(*topics)
        return True

    def _insert_with_task(
        self, instance_id: str, params: dict[str, Any], row: HistoryRow, task: TaskSpec
    ) -> bool:
        """The start, its first command's row and its queued task as one statement.

        Inside a caller's transaction (a view under ``ATOMIC_REQUESTS`` enqueueing
        tasks) the statement runs in a savepoint of its own, as the portable path's
        statements do, so that an error leaves the caller's transaction usable: three
        round trips instead of six (the savepoint, the three inserts, the NOTIFY, its
        release). Its NOTIFY is delivered at the caller's commit, and this process's
        activity workers are woken then.
        """
        if not self.db.one_statement:
            with self.db.atomic():
                inserted = self._start_with_task(instance_id, params, row, task)
                if inserted:
                    self.db.publish_on_commit(TOPIC_TASK)
            return inserted
        if not self._start_with_task(instance_id, params, row, task):
            return False
        self.db._publish_now(TOPIC_TASK)
        return True

    def _start_with_task(
        self, instance_id: str, params: dict[str, Any], row: HistoryRow, task: TaskSpec
    ) -> bool:
        """Run START_WITH_TASK (False: the id was taken, nothing written)."""
        row_sql, row_params = self.db._history_insert_sql(instance_id, row, "i")
        notify, notify_params = self.db.notifier.from_cte("i", [TOPIC_TASK])
        statement = sql.compose(
            START_WITH_TASK,
            start=self._insert_instance_sql(),
            row=row_sql,
            queued=sql.compose(sql.INSERT_QUEUED_TASK, source=" FROM i"),
            notify=notify,
        )
        task_params = self._queued_task_params(instance_id, row, task)
        fetched = self.db._fetch(
            statement, sql.bind(params, row_params, task_params, notify_params)
        )
        return bool(fetched[0][0])


class PostgresInstances(Instances):
    """Dispatch with ``SKIP LOCKED`` in one statement, and the one-statement close."""

    db: PostgresDatabase
    tasks: PostgresTasks

    def _lease_rows(self, named: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # One statement (atomic in autocommit): each part locks what it picks.
        statement = sql.compose(
            LEASE_BATCH,
            expired=sql.compose(sql.DISPATCH_EXPIRED, named=named),
            ready=sql.compose(sql.DISPATCH_READY, named=named),
        )
        return self.db._fetch(statement, params)

    @operation
    def close(self, fence: Fence, request: CloseRequest) -> str:
        """close: for the common case (nothing left to clean up, no parent, no children,
        not a cancellation) the fenced update, the close record and the NOTIFY in one
        statement."""
        if not (
            self.db.one_statement
            and request.status != WorkflowStatus.CANCELLED
            and not request.unfinished
            and not request.children
            and request.parent is not None
            and not request.parent[0]
        ):
            return super().close(fence, request)
        if self.db.has_deferred(fence):
            item = self.tasks.inline._sole_deferred(fence)
            if item is not None and not self.db.connection.in_atomic_block:
                return self._close_with_inline(fence, request, item)
            # The inline result before it, then the close: one transaction, two statements.
            with self.db.atomic():
                self.db.apply_deferred(fence)
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
        row_sql, row_params = self.db._history_insert_sql(
            fence.instance_id, self._close_row(status, data), "c"
        )
        topic = closed_topic(fence.instance_id)
        # Its wake-up is a waiter's hint, sent after the commit (is_waiter_hint).
        notify, notify_params = self.db.notifier.from_cte("c", [])
        statement = sql.compose(CLOSE, close=close_sql, history=row_sql, notify=notify)
        try:
            closed, _ = self.db._fetch(
                statement, sql.bind(close_params, row_params, notify_params)
            )[0]
        except IntegrityError as error:
            raise self.db._key_conflict(fence.instance_id, CLOSE_KEY) from error
        if closed != 1:
            raise self.db._fenced_error(fence)
        if deferred:
            self.db._closed_on_commit(fence.instance_id)
            self.db.after_commit(topic)
            return str(status)
        self.db._closed(fence.instance_id)
        self.db.after_commit(topic)
        return str(status)

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
        carrying, carried_params = self.tasks._carried_parts(item, fence)
        close_sql, close_params = self._close_sql(fence, status, request)
        row_sql, row_params = self.db._history_insert_sql(
            fence.instance_id, self._close_row(status, data), "c"
        )
        topic = closed_topic(fence.instance_id)
        notify, notify_params = self.db.notifier.from_cte("c", [])  # a hint: after the commit
        statement = sql.compose(
            CLOSE_WITH_INLINE, close=close_sql, closerow=row_sql, notify=notify, **carrying
        )
        params = sql.bind(carried_params, close_params, row_params, notify_params)
        try:
            claimed, closed, woke, _, _ = self.db._fetch(statement, params)[0]
        except IntegrityError as error:
            raise self.db._key_conflict(fence.instance_id, CLOSE_KEY) from error
        self.tasks._settle_carried(item, fence, recorded=bool(claimed), woke=bool(woke))
        if closed != 1:
            raise self.db._fenced_error(fence)
        self.db._closed(fence.instance_id)
        self.db.after_commit(topic)
        return str(status)


class PostgresStore(Store):
    """The store on PostgreSQL: its database and the parts that differ there."""

    database = PostgresDatabase
    instances_class = PostgresInstances
    starts_class = PostgresStarts
    bulk_starts_class = PostgresBulkStarts
    waits_class = PostgresWaits
    tasks_class = PostgresTasks
    sole_activity_class = PostgresSoleActivity
    streams_class = PostgresStreams
