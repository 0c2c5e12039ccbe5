"""The ORM store: every durable operation, one transaction each, on one database alias.

Fenced writes start with a conditional update of the instance row that must
touch exactly one row (the writer still holds the lease epoch); on PostgreSQL
that update also locks the row, so writers of one instance serialise. Claims
are fenced the same way by (owner, claim epoch) on the task row. Lease and
claim expiry use the database clock (``DbNowMs``). Wake-ups go out through the
in-process bus and, on PostgreSQL, NOTIFY, always after commit.

SQLite: write transactions begin IMMEDIATE (the write lock is taken up front and
waited for with the busy timeout) and the database runs in WAL mode, so worker
threads never see "database is locked".
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from . import exceptions as exc
from . import local_starts
from .engine.codec import Codec
from .engine.events import (
    CLOSE_EVENT_BY_STATUS,
    CLOSE_KEY,
    CMD_CLOSE,
    EV_ACTIVITY_CANCELLED,
    EV_ACTIVITY_COMPLETED,
    EV_ACTIVITY_FAILED,
    Fence,
    HistoryRow,
    SignalPosition,
    error_data,
)
from .engine.ports import ClaimedTask, CloseRequest, ExecutionSnapshot, TaskClaim, TaskSpec
from .models import (
    ActivityTask,
    ActivityTaskStatus,
    WorkflowInstance,
    WorkflowStatus,
)
from .store_base import (
    NOTIFY_CHANNEL,
    DbNowMs,
    StoreBase,
    _ms,
    clock_offset_ms,
    set_clock_offset_ms,
)
from .store_recovery import RecoveryStoreMixin
from .store_renewals import RenewalMixin
from .store_resume import ResumeStoreMixin
from .store_tasks import TaskSweepMixin

__all__ = [
    "NOTIFY_CHANNEL",
    "DbNowMs",
    "DjangoStore",
    "clock_offset_ms",
    "set_clock_offset_ms",
    "store_for",
]

logger = logging.getLogger("selvedge_django.store")

# The instance columns an execution reads, in the order InstanceHead takes them.
HEAD_COLUMNS = (
    "workflow_name, input, status, cancel_requested, cancel_reason, parent_instance_id, parent_key"
)


@dataclass(frozen=True)
class InstanceHead:
    """The instance row as an execution reads it (everything but the history)."""

    workflow_name: str
    input: Any
    status: str
    cancel_requested: bool
    cancel_reason: str
    parent_instance_id: str
    parent_key: str


class DjangoStore(ResumeStoreMixin, RecoveryStoreMixin, TaskSweepMixin, RenewalMixin, StoreBase):
    """Durable operations over the Django ORM for one database alias."""

    # -- instances ----------------------------------------------------------------------

    def create_instance(
        self,
        instance_id: str,
        workflow_name: str,
        input_value: Any,
        *,
        service_name: str = "",
        parent_instance_id: str = "",
        parent_key: str = "",
        started_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_ttl: float | None = None,
    ) -> Fence | None:
        """Insert a runnable instance; a taken id raises WorkflowAlreadyStarted.

        With ``lease_owner`` the instance is inserted already leased to that owner
        (epoch 1, expiring ``lease_ttl`` seconds from now on the database clock) and not
        runnable, and the fence is returned: the owner runs it without a dispatch,
        and no dispatcher can take it before the owner does. Nobody is woken then.
        """
        now = self._now_param(started_at or timezone.now())
        conn = self.connection
        stored_input = self._input_field.get_db_prep_save(input_value, conn)
        # One statement text whether leased or not (no owner: no expiry), so that
        # statement-level tools (the fault injector, pg_stat_statements) see one start.
        db_now = self.now_sql()
        lease_sql = f"%s, %s, (CASE WHEN %s THEN {db_now.sql} + %s END), %s"
        ttl = self.lease_ttl if lease_ttl is None else lease_ttl
        leased = lease_owner is not None
        lease_params = [
            lease_owner or "",
            1 if leased else 0,
            leased,
            *db_now.params,
            round(ttl * 1000),
            not leased,
        ]
        insert = (
            "INSERT INTO {instance} (instance_id, workflow_name, status, input, output,"
            " error, lease_owner, lease_epoch, lease_expires_ms, runnable,"
            " cancel_requested, cancel_reason, parent_instance_id, parent_key,"
            " service_name, current_step, started_at, updated_at, closed_at, ready_ms)"
            f" VALUES (%s, %s, %s, %s, NULL, NULL, {lease_sql}, %s, %s, %s, %s, %s, %s,"
            f" %s, %s, NULL, {db_now.sql})"
        )
        params = [
            instance_id,
            workflow_name,
            str(WorkflowStatus.RUNNING),
            stored_input,
            *lease_params,
            False,
            "",
            parent_instance_id,
            parent_key,
            service_name,
            "",
            now,
            now,
            *db_now.params,
        ]
        try:
            if leased and self.one_statement:
                self._execute(insert, params)  # nobody to wake: one statement, no transaction
            else:
                with self.atomic():
                    self._execute(insert, params)
                    if not leased:
                        self.after_commit("runnable")
        except IntegrityError as error:
            raise exc.WorkflowAlreadyStarted(instance_id) from error
        return None if lease_owner is None else Fence(instance_id, lease_owner, 1)

    @property
    def _input_field(self) -> Any:
        return WorkflowInstance._meta.get_field("input")

    def get_instance(self, instance_id: str) -> WorkflowInstance:
        try:
            return WorkflowInstance.objects.using(self.alias).get(instance_id=instance_id)
        except WorkflowInstance.DoesNotExist:
            raise exc.WorkflowNotFound(instance_id) from None

    def get_result_row(self, instance_id: str) -> tuple[str, str | None, str | None]:
        """An instance's (status, output, error), in one hand-written read."""
        conn = self.connection
        table = conn.ops.quote_name(WorkflowInstance._meta.db_table)
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT status, output, error FROM {table} WHERE instance_id = %s",
                [instance_id],
            )
            row = cursor.fetchone()
        if row is None:
            raise exc.WorkflowNotFound(instance_id)
        return str(row[0]), row[1], row[2]

    # -- leases -------------------------------------------------------------------------

    def acquire_batch(
        self, owner: str, ttl: float, limit: int, names: Sequence[str] | None
    ) -> list[Fence]:
        """Lease up to ``limit`` dispatchable instances (runnable or expired) for ``owner``."""
        return [fence for fence, _ in self.lease_batch(owner, ttl, limit, names)]

    def lease_batch(
        self, owner: str, ttl: float, limit: int, names: Sequence[str] | None
    ) -> list[tuple[Fence, InstanceHead]]:
        """Lease up to ``limit`` dispatchable instances and read their rows, in one statement.

        Dispatchable: running, and either owned under an expired lease (taken first:
        an execution was interrupted), or unowned and runnable since ``ready_ms`` at
        the latest, the one runnable longest first. So an instance that is runnable
        again right after each execution waits behind those that waited longer, and
        one busy workflow type cannot keep another from running; an instance held
        back after an execution error (``ready_ms`` in the future) waits until then.
        Each part walks its own partial index (``sv_inst_lease_idx``,
        ``sv_inst_ready_idx``), whose conditions the statement repeats as literals.

        On PostgreSQL the candidates are locked with ``FOR UPDATE SKIP LOCKED``, so
        concurrent dispatchers take different rows; on SQLite the write transaction
        (``BEGIN IMMEDIATE``) serialises them. The instance columns an execution
        needs come back with the lease, so loading its snapshot then reads only the
        history.
        """
        if limit <= 0 or (names is not None and not names):
            return []
        now = self.now_sql()
        named, name_params = "", []
        if names is not None:
            named = f" AND workflow_name IN ({', '.join(['%s'] * len(names))})"
            name_params = list(names)
        expired = (
            f"status = 'running' AND NOT (lease_owner = '') AND lease_expires_ms < {now.sql}{named}"
        )
        ready = (
            f"status = 'running' AND lease_owner = '' AND runnable AND ready_ms <= {now.sql}{named}"
        )
        expired_params = [*now.params, *name_params]
        ready_params = [*now.params, *name_params]
        lease = (
            "UPDATE {instance} SET lease_owner = %s, lease_epoch = lease_epoch + 1,"
            f" lease_expires_ms = {now.sql} + %s, runnable = %s"
        )
        lease_params = [owner, *now.params, round(ttl * 1000), False]
        if self.vendor == "postgresql":
            # One statement (atomic in autocommit): each part locks what it picks.
            rows = self._fetch(
                f"WITH e AS (SELECT instance_id FROM {{instance}} WHERE {expired}"
                " ORDER BY lease_expires_ms LIMIT %s FOR UPDATE SKIP LOCKED),"
                f" r AS (SELECT instance_id, ready_ms FROM {{instance}} WHERE {ready}"
                " ORDER BY ready_ms LIMIT %s FOR UPDATE SKIP LOCKED),"
                " c AS (SELECT instance_id FROM (SELECT instance_id, 0 AS part, 0 AS since"
                " FROM e UNION ALL SELECT instance_id, 1, ready_ms FROM r) u"
                " ORDER BY part, since LIMIT %s)"
                f" {lease} WHERE instance_id IN (SELECT instance_id FROM c)"
                f" RETURNING instance_id, lease_epoch, {HEAD_COLUMNS}",
                [*expired_params, limit, *ready_params, limit, limit, *lease_params],
            )
        else:
            # SQLite: pick, lease, read back, in one write transaction. (Its UPDATE ...
            # RETURNING reports no row count until the rows are read, which statement
            # wrappers such as the fault injector's need.) A read first: a write
            # transaction locks the whole database.
            probe = self._fetch(
                f"SELECT 1 WHERE EXISTS (SELECT 1 FROM {{instance}} WHERE {ready})"
                f" OR EXISTS (SELECT 1 FROM {{instance}} WHERE {expired})",
                [*ready_params, *expired_params],
            )
            if not probe:
                return []
            with self.atomic():
                ids = [
                    r[0]
                    for r in self._fetch(
                        "SELECT instance_id FROM (SELECT instance_id, 0 AS part, 0 AS since"
                        f" FROM (SELECT instance_id FROM {{instance}} WHERE {expired}"
                        " ORDER BY lease_expires_ms LIMIT %s) UNION ALL"
                        " SELECT instance_id, 1, ready_ms FROM (SELECT instance_id, ready_ms"
                        f" FROM {{instance}} WHERE {ready} ORDER BY ready_ms LIMIT %s))"
                        " ORDER BY part, since LIMIT %s",
                        [*expired_params, limit, *ready_params, limit, limit],
                    )
                ]
                if not ids:
                    return []
                marks = ", ".join(["%s"] * len(ids))
                self._execute(f"{lease} WHERE instance_id IN ({marks})", [*lease_params, *ids])
                rows = self._fetch(
                    f"SELECT instance_id, lease_epoch, {HEAD_COLUMNS} FROM {{instance}}"
                    f" WHERE lease_owner = %s AND instance_id IN ({marks})",
                    [owner, *ids],
                )
        return [(Fence(row[0], owner, row[1]), self._head(row[2:])) for row in rows]

    def _head(self, row: Sequence[Any]) -> InstanceHead:
        name, input_value, status, cancel_requested, reason, parent, parent_key = row
        return InstanceHead(
            workflow_name=name,
            input=self._input_field.from_db_value(input_value, None, self.connection),
            status=status,
            cancel_requested=bool(cancel_requested),
            cancel_reason=reason,
            parent_instance_id=parent,
            parent_key=parent_key,
        )

    def acquire(self, instance_id: str, owner: str, ttl: float) -> Fence | None:
        """Lease one instance if it is dispatchable."""
        with self.atomic():
            qs = WorkflowInstance.objects.using(self.alias).filter(
                Q(instance_id=instance_id, status=WorkflowStatus.RUNNING)
                & (
                    Q(runnable=True, lease_owner="")
                    | (Q(lease_expires_ms__lt=self.now_expr()) & ~Q(lease_owner=""))
                )
            )
            if not qs.update(
                lease_owner=owner,
                lease_epoch=F("lease_epoch") + 1,
                lease_expires_ms=self.now_expr(ttl),
                runnable=False,
            ):
                return None
            epoch = (
                WorkflowInstance.objects.using(self.alias)
                .filter(instance_id=instance_id)
                .values_list("lease_epoch", flat=True)
                .get()
            )
        return Fence(instance_id, owner, epoch)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        """Extend an unexpired matching lease on the database clock."""
        return bool(
            WorkflowInstance.objects.using(self.alias)
            .filter(
                instance_id=fence.instance_id,
                lease_owner=fence.owner,
                lease_epoch=fence.epoch,
                status=WorkflowStatus.RUNNING,
                lease_expires_ms__gte=self.now_expr(),
            )
            .update(lease_expires_ms=self.now_expr(ttl))
        )

    def release_lease(self, fence: Fence, runnable: bool = False) -> None:
        """Clear a matching lease, keeping pending input runnable.

        The execution ended without a storage error: its instance's count of them
        in a row goes back to 0, in the same update.
        """
        conn = self.connection
        if conn.features.can_return_columns_from_insert:
            # One statement that also says whether input arrived meanwhile: only then
            # is a dispatcher woken (every worker's, through NOTIFY), not on every release.
            table = conn.ops.quote_name(WorkflowInstance._meta.db_table)
            now = self.now_sql()
            with conn.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET lease_owner = '', lease_expires_ms = NULL,"
                    " execution_errors = 0, execution_error = '',"
                    f" ready_ms = CASE WHEN runnable OR NOT %s THEN ready_ms ELSE {now.sql} END,"
                    " runnable = (runnable OR %s) WHERE instance_id = %s AND lease_owner = %s"
                    " AND lease_epoch = %s RETURNING runnable",
                    [runnable, *now.params, runnable, fence.instance_id, fence.owner, fence.epoch],
                )
                row = cursor.fetchone()
            if row is not None and row[0]:
                self.after_commit("runnable")
            return
        updated = (
            WorkflowInstance.objects.using(self.alias)
            .filter(
                instance_id=fence.instance_id,
                lease_owner=fence.owner,
                lease_epoch=fence.epoch,
            )
            .update(
                lease_owner="",
                lease_expires_ms=None,
                execution_errors=0,
                execution_error="",
                **(self.wake_fields() if runnable else {}),
            )
        )
        if updated:
            # An arrival during the execution may have left it runnable: dispatch again.
            self.after_commit("runnable")

    def load_snapshot(
        self,
        instance_id: str,
        head: InstanceHead | None = None,
        *,
        max_events: int | None = None,
    ) -> ExecutionSnapshot:
        """Read the instance (unless its ``head`` came with the lease) and its whole history.

        The history and the delivered signals come back in one statement, in no
        particular order: the engine indexes rows by key and position, and signals
        by id (sorting 10,000 rows in the database was a tenth of loading them).
        With ``max_events`` at most that many history rows plus one are read: more
        than ``max_events`` means the history is over the limit (which rows came
        back is then unspecified).
        """
        if head is None:
            rows = self._fetch(
                f"SELECT {HEAD_COLUMNS} FROM {{instance}} WHERE instance_id = %s", [instance_id]
            )
            if not rows:
                raise exc.WorkflowNotFound(instance_id)
            head = self._head(rows[0])
        history: list[HistoryRow] = []
        signals: list[SignalPosition] = []
        history_sql = (
            "SELECT 0, id, key, seq, command, event_type, data, reservation, delivered_seq"
            " FROM {history} WHERE instance_id = %s"
        )
        params: list[Any] = [instance_id]
        if max_events is not None:
            history_sql = f"SELECT * FROM ({history_sql} LIMIT %s) bounded"
            params.append(max_events + 1)
        rows = self._fetch(
            history_sql + " UNION ALL SELECT 1, id, channel, delivered_seq, NULL, NULL, NULL, NULL,"
            " consumed_seq FROM {signal} WHERE instance_id = %s AND delivered_seq IS NOT NULL",
            [*params, instance_id],
        )
        for kind, row_id, key, seq, command, event_type, data, reserved, delivered in rows:
            if kind == 0:
                history.append(HistoryRow(key, seq, command, event_type, data, reserved, delivered))
            else:
                signals.append(SignalPosition(row_id, key, seq, delivered))
        signals.sort(key=attrgetter("id"))
        return ExecutionSnapshot(
            instance_id=instance_id,
            workflow_name=head.workflow_name,
            input=head.input,
            status=head.status,
            cancel_requested=head.cancel_requested,
            cancel_reason=head.cancel_reason,
            parent_instance_id=head.parent_instance_id,
            parent_key=head.parent_key,
            history=history,
            signals=signals,
        )

    # -- history ------------------------------------------------------------------------

    def record_command(self, fence: Fence, row: HistoryRow) -> HistoryRow:
        with self.atomic():
            self._fence(fence)
            return self._insert_row(fence.instance_id, row)

    # -- activity tasks -----------------------------------------------------------------

    def _claim_ttl(self, start_to_close: float | None, heartbeat: float | None) -> float:
        ttl = self.lease_ttl
        if heartbeat is not None:
            ttl = min(ttl, heartbeat)
        if start_to_close is not None:
            ttl = min(ttl, start_to_close)
        return ttl

    def reserve_activity(
        self,
        fence: Fence,
        row: HistoryRow,
        task: TaskSpec,
        claim_owner: str | None,
        *,
        release: bool = False,
        observe_cancel: bool = False,
    ) -> tuple[HistoryRow, ClaimedTask | None]:
        """Reserve the command and create its task (claimed inline when asked) atomically.

        ``release`` also releases the lease in the same write. With ``observe_cancel``
        an inline claim is taken only while no cancel request is recorded, checked by
        the fence itself; after a request the reservation records the cancellation
        that ``Future.get()`` would record, with a cancelled task, and claims nothing.
        """
        ttl = self._claim_ttl(task.start_to_close_timeout, task.heartbeat_timeout)
        fields: dict[str, Any] = dict(
            instance_id=fence.instance_id,
            workflow_name=task.workflow_name,
            key=row.key,
            seq=row.seq or 0,
            name=task.name,
            input=task.input,
            queue=task.queue,
            options=task.options,
            max_attempts=task.max_attempts,
            schedule_to_start_ms=_ms(task.schedule_to_start_timeout),
            start_to_close_ms=_ms(task.start_to_close_timeout),
            heartbeat_timeout_ms=_ms(task.heartbeat_timeout),
            not_before_ms=0,
        )
        if claim_owner is not None:
            fields.update(
                status=ActivityTaskStatus.RUNNING,
                attempts=1,
                claim_owner=claim_owner,
                claim_epoch=1,
                claim_expires_ms=self.now_sql(ttl),
                claim_started_ms=self.now_sql(),
                attempt_deadline_ms=None
                if task.start_to_close_timeout is None
                else self.now_sql(task.start_to_close_timeout),
            )
        else:
            fields.update(
                status=ActivityTaskStatus.QUEUED,
                schedule_deadline_ms=None
                if task.schedule_to_start_timeout is None
                else self.now_sql(task.schedule_to_start_timeout),
            )
        current_step = f"activity {task.name}"
        guarded = observe_cancel and claim_owner is not None
        claimed_at = time.monotonic()
        try:
            task_id = self._reserve(fence, row, fields, current_step, release, guarded)
        except exc.Fenced:
            reason = self._cancel_reason_under(fence) if guarded else None
            if reason is None:
                raise
            return self._reserve_cancelled(fence, row, task, current_step, reason), None
        if claim_owner is None:
            return row, None
        claimed = ClaimedTask(
            claim=TaskClaim(task_id, fence.instance_id, row.key, claim_owner, 1),
            name=task.name,
            workflow_name=task.workflow_name,
            input=task.input,
            options=task.options,
            attempt=1,
            failures=0,
            max_attempts=task.max_attempts,
            claim_ttl=ttl,
            start_to_close_timeout=task.start_to_close_timeout,
            heartbeat_timeout=task.heartbeat_timeout,
            claimed_at=claimed_at,
        )
        return row, claimed

    def _reserve(
        self,
        fence: Fence,
        row: HistoryRow,
        fields: dict[str, Any],
        current_step: str,
        release: bool,
        uncancelled: bool = False,
    ) -> int:
        """Write the fence, the history row and the task; return the task's id."""
        queued = fields["status"] == ActivityTaskStatus.QUEUED
        if self.one_statement:
            return self._reserve_one_statement(
                fence, row, fields, current_step, queued, release, uncancelled
            )
        with self.atomic():
            self._fence(fence, current_step=current_step, release=release, uncancelled=uncancelled)
            self._insert_row(fence.instance_id, row)
            task_id = int(self._insert(ActivityTask, fields, returning_id=True))
            if queued:
                self.after_commit("task")
        return task_id

    def _reserve_cancelled(
        self, fence: Fence, row: HistoryRow, task: TaskSpec, current_step: str, reason: str
    ) -> HistoryRow:
        """Reserve an activity issued after a cancel request: recorded as cancelled.

        The same end state as a reservation followed by ``Future.get()`` observing
        the request (the task cancelled before any attempt, the row filled with the
        ``WorkflowCancelled`` and left for a delivery batch), in one write, so no
        activity worker can claim the task in between.
        """
        cancelled = HistoryRow(
            row.key,
            row.seq,
            row.command,
            EV_ACTIVITY_CANCELLED,
            error_data(exc.WorkflowCancelled(fence.instance_id, reason)),
            row.reservation,
        )
        fields: dict[str, Any] = dict(
            instance_id=fence.instance_id,
            workflow_name=task.workflow_name,
            key=row.key,
            seq=row.seq or 0,
            name=task.name,
            input=task.input,
            queue=task.queue,
            options=task.options,
            max_attempts=task.max_attempts,
            schedule_to_start_ms=_ms(task.schedule_to_start_timeout),
            start_to_close_ms=_ms(task.start_to_close_timeout),
            heartbeat_timeout_ms=_ms(task.heartbeat_timeout),
            not_before_ms=0,
            status=ActivityTaskStatus.CANCELLED,
        )
        self._reserve(fence, cancelled, fields, current_step, release=False)
        return cancelled

    def _reserve_one_statement(
        self,
        fence: Fence,
        row: HistoryRow,
        fields: dict[str, Any],
        current_step: str,
        queued: bool,
        release: bool,
        uncancelled: bool,
    ) -> int:
        """reserve_activity on PostgreSQL: fence, history row and task in one statement.

        With ``release`` the fence update also releases the lease; dispatchers are
        woken when the instance is still runnable (input arrived meanwhile).
        """
        fence_sql, fence_params = self._fence_sql(
            fence, current_step, release=release, uncancelled=uncancelled
        )
        history_sql, history_params = self._history_insert_sql(fence.instance_id, row, "f")
        columns, marks, task_params = self._insert_parts(ActivityTask, fields, skip_pk=True)
        notify, notify_params = self._notify_from("t", ["task"] if queued else [])
        wake, wake_params = self._notify_from("r", ["runnable"] if release else [])
        try:
            fenced, runnable, task_id, _, _ = self._fetch(
                f"WITH f AS ({fence_sql} RETURNING instance_id, runnable),"
                f" h AS ({history_sql} RETURNING id),"
                f" t AS (INSERT INTO {{task}} ({columns}) SELECT {marks} FROM h RETURNING id),"
                " r AS (SELECT 1 FROM f WHERE runnable)"
                f" SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM r), (SELECT id FROM t),"
                f" {notify}, {wake}",
                [*fence_params, *history_params, *task_params, *notify_params, *wake_params],
            )[0]
        except IntegrityError as error:
            raise self._key_conflict(fence.instance_id, row.key) from error
        if fenced != 1:
            raise self._fenced_error(fence)
        if queued:
            self._publish_now("task")
        if release and runnable:
            self._publish_now("runnable")
        return int(task_id)

    def _claimable(self) -> Any:
        now = self.now_expr()
        qs = ActivityTask.objects.using(self.alias).filter(
            Q(status=ActivityTaskStatus.QUEUED, not_before_ms__lte=now)
            | (
                Q(status=ActivityTaskStatus.RUNNING, claim_expires_ms__lt=now)
                & (Q(max_attempts=0) | Q(failures__lt=F("max_attempts") - 1))
            )
        )
        if self.activity_queues is not None:
            qs = qs.filter(queue__in=list(self.activity_queues))
        return qs

    def _take_claims(self, ids: list[int], owner: str) -> list[ClaimedTask]:
        """Claim the given task ids (already filtered and locked) and read them back in full.

        Each row is updated once: on PostgreSQL a second update of a row this
        transaction already changed queues the deferred foreign-key check of the task
        for COMMIT, where it waits behind a fenced writer of the instance (a scope
        cancel or close) that itself waits for this task row: a deadlock.
        """
        if not ids:
            return []
        claimed_at = time.monotonic()
        before = list(ActivityTask.objects.using(self.alias).filter(id__in=ids).order_by("id"))
        ttls: dict[int, tuple[float, float | None, float | None]] = {}
        for task in before:
            start_to_close = task.start_to_close_ms / 1000 if task.start_to_close_ms else None
            heartbeat = task.heartbeat_timeout_ms / 1000 if task.heartbeat_timeout_ms else None
            ttl = self._claim_ttl(start_to_close, heartbeat)
            ttls[task.id] = (ttl, start_to_close, heartbeat)
            fields: dict[str, Any] = dict(
                status=ActivityTaskStatus.RUNNING,
                attempts=F("attempts") + 1,
                claim_owner=owner,
                claim_epoch=F("claim_epoch") + 1,
                claim_started_ms=self.now_expr(),
                schedule_deadline_ms=None,
                claim_expires_ms=self.now_expr(ttl),
                attempt_deadline_ms=self.now_expr(start_to_close) if start_to_close else None,
            )
            if task.claim_expires_ms is not None:
                # A lapsed claim taken over: its lapse is counted as a failure here.
                fields["failures"] = F("failures") + 1
                fields["last_error"] = self._lapse_envelope(task, task.attempts)
            ActivityTask.objects.using(self.alias).filter(id=task.id).update(**fields)
        read_back = {
            task_id: (epoch, attempts, failures)
            for task_id, epoch, attempts, failures in ActivityTask.objects.using(self.alias)
            .filter(id__in=ids, claim_owner=owner)
            .values_list("id", "claim_epoch", "attempts", "failures")
        }
        claimed: list[ClaimedTask] = []
        for task in before:
            if task.id not in read_back:
                continue
            epoch, attempts, failures = read_back[task.id]
            ttl, start_to_close, heartbeat = ttls[task.id]
            claimed.append(
                ClaimedTask(
                    claim=TaskClaim(task.id, task.instance_id, task.key, owner, epoch),
                    name=task.name,
                    workflow_name=task.workflow_name,
                    input=task.input,
                    options=task.options,
                    attempt=attempts,
                    failures=failures,
                    max_attempts=task.max_attempts,
                    claim_ttl=ttl,
                    start_to_close_timeout=start_to_close,
                    heartbeat_timeout=heartbeat,
                    claimed_at=claimed_at,
                )
            )
        return claimed

    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        """Claim one task of an instance inline, if due and servable here."""
        names = self.activity_names()
        with self.atomic():
            qs = self._claimable().filter(instance_id=instance_id, key=key)
            if names is not None:
                qs = qs.filter(name__in=list(names))
            ids = list(
                qs.order_by().select_for_update(skip_locked=True).values_list("id", flat=True)[:1]
            )
            claimed = self._take_claims(ids, owner)
        return claimed[0] if claimed else None

    def claim_tasks(self, owner: str, limit: int, names: Sequence[str]) -> list[ClaimedTask]:
        """Claim up to ``limit`` due tasks of registered activities, oldest first."""
        if limit <= 0 or not names:
            return []
        if not self.worth_locking(self._claimable().filter(name__in=list(names))):
            return []
        with self.atomic():
            ids = list(
                self._claimable()
                .filter(name__in=list(names))
                .order_by("not_before_ms", "id")
                .select_for_update(skip_locked=True)
                .values_list("id", flat=True)[:limit]
            )
            return self._take_claims(ids, owner)

    def _claim_filter(self, claim: TaskClaim, *, live: bool = False) -> Any:
        """The task row an attempt still owns; ``live`` also requires an unexpired claim.

        Every write of an attempt's outcome (complete, fail, retry, release) asks for a
        live claim: a lapsed one goes through the lapse path instead (the lapse counts
        as a failure and the task is claimable again at once, without backoff), so a
        late attempt's error never becomes the outcome, nor its backoff the wait.
        """
        qs = ActivityTask.objects.using(self.alias).filter(
            id=claim.task_id,
            claim_owner=claim.owner,
            claim_epoch=claim.epoch,
            status=ActivityTaskStatus.RUNNING,
        )
        if live:
            qs = qs.filter(claim_expires_ms__gte=self.now_expr())
        return qs

    def _arrive_sql(
        self, claim: TaskClaim, event_type: str, data: str, inline_fence: Fence | None
    ) -> tuple[tuple[str, list[Any]], tuple[str, list[Any]]]:
        """The two updates of an arrival: the history value, and the wake of the instance."""
        record = (
            "UPDATE {history} SET data = %s, event_type = %s, arrived_at = %s"
            " WHERE instance_id = %s AND key = %s AND data IS NULL",
            [data, event_type, self._now_param(), claim.instance_id, claim.key],
        )
        woken = self.wake_sql()
        wake = f"UPDATE {{instance}} SET {woken.sql} WHERE instance_id = %s AND status = %s"
        params: list[Any] = [*woken.params, claim.instance_id, str(WorkflowStatus.RUNNING)]
        if inline_fence is not None:
            # The execution that ran the attempt inline reads the value itself; any
            # other holder (or none) must be woken.
            wake += " AND NOT (lease_owner = %s AND lease_epoch = %s)"
            params += [inline_fence.owner, inline_fence.epoch]
        return record, (wake, params)

    def _arrive(
        self, claim: TaskClaim, event_type: str, data: str, inline_fence: Fence | None
    ) -> None:
        (record, record_params), (wake, wake_params) = self._arrive_sql(
            claim, event_type, data, inline_fence
        )
        self._execute(record, record_params)
        if self._execute(wake, wake_params):
            self.after_commit("runnable")

    def complete_task(
        self,
        claim: TaskClaim,
        output: str,
        *,
        inline_fence: Fence | None = None,
    ) -> bool:
        """Record a successful attempt; False when the claim was lost (late result)."""
        db_now = self.now_sql()
        complete = (
            "UPDATE {task} SET status = %s, claim_expires_ms = NULL WHERE id = %s"
            " AND claim_owner = %s AND claim_epoch = %s AND status = %s"
            f" AND claim_expires_ms >= {db_now.sql}"
        )
        params = [
            str(ActivityTaskStatus.COMPLETED),
            claim.task_id,
            claim.owner,
            claim.epoch,
            str(ActivityTaskStatus.RUNNING),
            *db_now.params,
        ]
        if self.one_statement:
            # The claim check, the value and the wake-up, as one statement.
            (record, record_params), (wake, wake_params) = self._arrive_sql(
                claim, EV_ACTIVITY_COMPLETED, output, inline_fence
            )
            notify, notify_params = self._notify_from("w", ["runnable"])
            # Lock order: the instance row first (i), as on every path that writes an
            # instance's history, tasks or timers; then the task, history and wake.
            claimed, woken, _ = self._fetch(
                "WITH i AS (SELECT instance_id FROM {instance} WHERE instance_id = %s"
                " FOR NO KEY UPDATE),"
                f" t AS ({complete} AND EXISTS (SELECT 1 FROM i) RETURNING id),"
                f" h AS ({record} AND EXISTS (SELECT 1 FROM t) RETURNING id),"
                f" w AS ({wake} AND EXISTS (SELECT 1 FROM t) RETURNING instance_id)"
                f" SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM w), {notify}",
                [claim.instance_id, *params, *record_params, *wake_params, *notify_params],
            )[0]
            if woken:
                self._publish_now("runnable")
            return bool(claimed)
        with self.atomic():
            self._lock_instance(claim.instance_id)
            if not self._execute(complete, params):
                return False
            self._arrive(claim, EV_ACTIVITY_COMPLETED, output, inline_fence)
        return True

    def fail_task(
        self,
        claim: TaskClaim,
        error: str,
        *,
        count_failure: bool = True,
        inline_fence: Fence | None = None,
        last_error: str | None = None,
    ) -> bool:
        """Record a final failure (non-retryable or retries exhausted) of a live claim.

        ``error`` is the outcome recorded in history; the task keeps ``last_error``
        (default: the same), the error of the attempt itself.
        """
        with self.atomic():
            self._lock_instance(claim.instance_id)
            if not self._claim_filter(claim, live=True).update(
                status=ActivityTaskStatus.FAILED,
                claim_expires_ms=None,
                last_error=error if last_error is None else last_error,
                failures=F("failures") + (1 if count_failure else 0),
            ):
                return False
            self._arrive(claim, EV_ACTIVITY_FAILED, error, inline_fence)
        return True

    def retry_task(self, claim: TaskClaim, error: str, delay: float) -> bool:
        """Return the task of a live claim to the queue with one more failure and a
        not-before time (False for a lost or lapsed claim)."""
        with self.atomic():
            if not self._claim_filter(claim, live=True).update(
                status=ActivityTaskStatus.QUEUED,
                claim_owner="",
                claim_expires_ms=None,
                failures=F("failures") + 1,
                last_error=error,
                not_before_ms=self.now_expr(delay),
                schedule_deadline_ms=Case(
                    When(
                        schedule_to_start_ms__isnull=False,
                        then=self.now_expr(delay) + F("schedule_to_start_ms"),
                    ),
                    default=Value(None),
                ),
            ):
                return False
            self.after_commit("task")
        return True

    def release_task(self, claim: TaskClaim) -> bool:
        """Give a live claim back (shutdown): no failure counted, claimable again at once.

        A lapsed claim is refused: its lapse was already a failure.
        """
        with self.atomic():
            released = self._claim_filter(claim, live=True).update(
                status=ActivityTaskStatus.QUEUED,
                claim_owner="",
                claim_expires_ms=None,
                not_before_ms=0,
                schedule_deadline_ms=Case(
                    When(
                        schedule_to_start_ms__isnull=False,
                        then=self.now_expr() + F("schedule_to_start_ms"),
                    ),
                    default=Value(None),
                ),
            )
            if released:
                self.after_commit("task")
        return bool(released)

    def renew_task(self, claim: TaskClaim, ttl: float) -> bool:
        """Extend a live claim, never past the attempt's start-to-close deadline."""
        expires = self.now_expr(ttl)
        return bool(
            self._claim_filter(claim)
            .filter(claim_expires_ms__gte=self.now_expr())
            .update(
                claim_expires_ms=Case(
                    When(
                        attempt_deadline_ms__isnull=False,
                        attempt_deadline_ms__lt=expires,
                        then=F("attempt_deadline_ms"),
                    ),
                    default=expires,
                )
            )
        )

    def claim_alive(self, claim: TaskClaim) -> bool:
        return self._claim_filter(claim).exists()

    def claim_live(self, claim: TaskClaim) -> bool:
        """Whether ``claim`` is still its attempt's and unexpired."""
        return bool(self._claim_filter(claim, live=True).exists())

    def extend_claim_under_lock(self, claim: TaskClaim, ttl: float) -> bool:
        """Extend a claim still this attempt's, expired or not, within its deadline (SQLite).

        Only for a transaction that holds SQLite's write lock since it found the claim
        live (a transactional attempt): nobody else could write since then, so nobody
        can have acted on the claim's expiry, and the extension is the renewal the
        renewer could not make. Never past the attempt's start-to-close deadline: an
        attempt past it has timed out.
        """
        now = self.now_expr()
        expires = self.now_expr(ttl)
        return bool(
            self._claim_filter(claim)
            .filter(Q(attempt_deadline_ms__isnull=True) | Q(attempt_deadline_ms__gte=now))
            .update(
                claim_expires_ms=Case(
                    When(
                        attempt_deadline_ms__isnull=False,
                        attempt_deadline_ms__lt=expires,
                        then=F("attempt_deadline_ms"),
                    ),
                    default=expires,
                )
            )
        )

    def next_task_due_ms(self, names: Sequence[str]) -> int | None:
        """Milliseconds until the next queued task becomes due (None: nothing queued)."""
        if not names:
            return None
        qs = ActivityTask.objects.using(self.alias).filter(
            status=ActivityTaskStatus.QUEUED, name__in=list(names)
        )
        if self.activity_queues is not None:
            qs = qs.filter(queue__in=list(self.activity_queues))
        first = qs.order_by("not_before_ms").values_list("not_before_ms", flat=True).first()
        if first is None:
            return None
        return max(0, first - self.now_ms())

    # -- close --------------------------------------------------------------------------

    def close(self, fence: Fence, request: CloseRequest) -> str:
        """Close the instance with everything closing implies, in one fenced transaction.

        Returns the status written (a cancellation without a durable request closes
        as failed).
        """
        if (
            self.one_statement
            and request.status != WorkflowStatus.CANCELLED
            and not request.unfinished
            and not request.children
            and request.parent is not None
            and not request.parent[0]
        ):
            return self._close_one_statement(fence, request)
        with self.atomic():
            # Lock order: a child's close takes its parent's row before its own (an
            # ancestor before a descendant, as a parent's close cancelling its children
            # does), and decides there whether the parent still waits for the outcome.
            parent_waits = self._wake_waiting_parent(fence.instance_id, request.parent)
            status = request.status
            if status == WorkflowStatus.CANCELLED:
                self._fence(fence)
                requested = (
                    WorkflowInstance.objects.using(self.alias)
                    .filter(instance_id=fence.instance_id)
                    .values_list("cancel_requested", flat=True)
                    .get()
                )
                if not requested:
                    status = WorkflowStatus.FAILED
            sql, params = self._close_sql(fence, status, request)
            # The fence check and the close are one conditional update.
            if self._execute(sql, params) != 1:
                raise self._fenced_error(fence)
            data = request.output if status == WorkflowStatus.COMPLETED else request.error
            self._insert_row(fence.instance_id, self._close_row(status, data))
            if request.unfinished:
                self._close_cleanup(fence.instance_id)
            self._close_cascade(
                fence.instance_id, status, data, children=request.children, parent=parent_waits
            )
            # A waiter in this process reads the row again once the handed-over execution
            # is no longer marked running: unmark it before the wake-up goes out.
            transaction.on_commit(
                functools.partial(local_starts.finished, fence.instance_id), using=self.alias
            )
            self.after_commit(f"closed:{fence.instance_id}")
        return str(status)

    def _close_sql(self, fence: Fence, status: str, request: CloseRequest) -> tuple[str, list[Any]]:
        now = self._now_param()
        return (
            "UPDATE {instance} SET status = %s, output = %s, error = %s, lease_owner = '',"
            " lease_expires_ms = NULL, runnable = %s, current_step = '', closed_at = %s,"
            " updated_at = %s"
            " WHERE instance_id = %s AND lease_owner = %s AND lease_epoch = %s"
            " AND status = %s",
            [
                str(status),
                request.output,
                request.error,
                False,
                now,
                now,
                fence.instance_id,
                fence.owner,
                fence.epoch,
                str(WorkflowStatus.RUNNING),
            ],
        )

    @staticmethod
    def _close_row(status: str, data: str | None) -> HistoryRow:
        return HistoryRow(
            key=CLOSE_KEY,
            seq=None,
            command=CMD_CLOSE,
            event_type=CLOSE_EVENT_BY_STATUS[status],
            data=data,
        )

    def _close_one_statement(self, fence: Fence, request: CloseRequest) -> str:
        """close on PostgreSQL for the common case (nothing left to clean up, no parent,
        no children, not a cancellation): the fenced update, the close record and the
        NOTIFY in one statement."""
        status = request.status
        data = request.output if status == WorkflowStatus.COMPLETED else request.error
        close_sql, close_params = self._close_sql(fence, status, request)
        row_sql, row_params = self._history_insert_sql(
            fence.instance_id, self._close_row(status, data), "c"
        )
        topic = f"closed:{fence.instance_id}"
        notify, notify_params = self._notify_from("c", [topic])
        try:
            closed, _ = self._fetch(
                f"WITH c AS ({close_sql} RETURNING instance_id), h AS ({row_sql} RETURNING id)"
                f" SELECT (SELECT count(*) FROM c), {notify}",
                [*close_params, *row_params, *notify_params],
            )[0]
        except IntegrityError as error:
            raise self._key_conflict(fence.instance_id, CLOSE_KEY) from error
        if closed != 1:
            raise self._fenced_error(fence)
        local_starts.finished(fence.instance_id)
        self._publish_now(topic)
        return str(status)

    # -- client reads -------------------------------------------------------------------

    def list_tasks(self, instance_id: str) -> list[ActivityTask]:
        return list(
            ActivityTask.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("seq", "id")
        )


_stores: dict[str, DjangoStore] = {}


def store_for(alias: str, codec: Codec) -> DjangoStore:
    """Return a store for ``alias`` (a new object; cheap)."""
    return DjangoStore(alias, codec)
