"""Instance rows: starts, leases, snapshots, cancel requests, closes, terminate, backoff, prune.

Every method is one transaction (or one statement). Fenced writes start with a
conditional update of the instance row that must touch exactly one row (the
writer still holds the lease epoch). Lease expiry uses the database clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import attrgetter
from typing import Any

from django.db.models import Exists, F, OuterRef, Q

from .. import exceptions as exc
from ..engine.codec import envelope_type
from ..engine.events import (
    CLOSE_EVENT_BY_STATUS,
    CLOSE_KEY,
    CMD_CLOSE,
    Fence,
    HistoryRow,
    SignalPosition,
)
from ..engine.ports import CloseRequest, ExecutionSnapshot
from ..models import WorkflowInstance, WorkflowStatus
from . import sql
from .children import Children
from .db import Database
from .operation import operation
from .options import StoreOptions
from .starts import input_field
from .tasks import Tasks
from .wakeups import closed_topic

__all__ = ["EXECUTION_ERROR_CHARS", "InstanceHead", "Instances"]

# The most of an error's text kept on the instance (``execution_error``).
EXECUTION_ERROR_CHARS = 2000


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
    parked_seq: int = 0
    parked_key: str = ""
    history_generation: int = 1
    # With a lease: the value that arrived at ``parked_key`` (event type, data), if any.
    parked_value: tuple[str, str] | None = None
    # With a lease: no history row and no delivered signal (a snapshot has nothing to read).
    history_empty: bool = False
    dispatch_lag_ms: int | None = None  # a dispatch's (metrics): ms runnable before the lease
    taken_over: bool = False
    # A dispatch's: a monotonic time of this process no later than the lease's statement
    # (after any wait for SQLite's writer turn), from which the lease can be trusted.
    leased_at: float | None = None


class Instances:
    """Leases, snapshots, commands, closes and what holds an instance back
    (``store.instances``).

    A close cascades to the instance's children and parent through ``children``; the
    dialect's close may carry an inline result of ``tasks`` in its own statement.
    """

    def __init__(
        self, db: Database, options: StoreOptions, *, children: Children, tasks: Tasks
    ) -> None:
        self.db = db
        self.options = options
        self.children = children
        self.tasks = tasks

    # -- progress -----------------------------------------------------------------------

    @operation
    def set_progress(self, fence: Fence, progress: str) -> None:
        """Store the instance's progress (JSON text) under the fence, in one statement."""
        params = {
            "progress": progress,
            "updated_at": self.db._now_param(),
            **self.db._fence_params(fence),
        }
        if self.db._execute(sql.SET_PROGRESS, params) != 1:
            raise self.db._fenced_error(fence)

    # -- leases -------------------------------------------------------------------------

    @operation
    def acquire_batch(
        self, owner: str, ttl: float, limit: int, names: Sequence[str] | None
    ) -> list[Fence]:
        """Lease up to ``limit`` dispatchable instances (runnable or expired) for ``owner``."""
        return [fence for fence, _ in self.lease_batch(owner, ttl, limit, names)]

    @operation
    def lease_batch(
        self,
        owner: str,
        ttl: float,
        limit: int,
        names: Sequence[str] | None,
        passed_over: Sequence[str] = (),
    ) -> list[tuple[Fence, InstanceHead]]:
        """Lease up to ``limit`` dispatchable instances and read their rows.

        Dispatchable: running, and either owned under an expired lease (taken first:
        an execution was interrupted), or unowned and runnable since ``ready_ms`` at
        the latest, by sql.READY_RANK (a priority point is worth a minute waited). So
        an instance runnable again after each execution waits behind those that
        waited longer, and a higher priority goes first without starving a lower
        one; one held back after an execution error waits until its ``ready_ms``.
        Each part walks its partial index (``sv_inst_lease_idx``,
        ``sv_inst_rank_idx``), whose conditions the statement repeats as literals.
        The instance columns an execution needs come back with the lease, so loading
        its snapshot then reads only the history; so does the value that arrived at the
        command the last execution parked at (``InstanceHead.parked_value``), so an
        execution the worker's cache kept goes on without reading it. How concurrent
        dispatchers keep
        apart is the dialect's (:meth:`_lease_rows`). ``passed_over`` names instances
        this owner does not take (their values are encrypted under a key it lacks).
        """
        versions = self.options.compatible_versions
        if limit <= 0 or (names is not None and not names) or versions == ():
            return []
        named = "" if names is None else sql.in_list("workflow_name", len(names), "workflow")
        ttl_ms = round(ttl * 1000)
        params = {"owner": owner, "limit": limit, "ttl_ms": ttl_ms, "runnable": False}
        params.update(sql.numbered("workflow", names or ()))
        if versions is not None:
            version_sql, version_params = self.versions_sql(versions)
            named += version_sql
            params.update(version_params)
        if passed_over:
            named += sql.not_in_list("instance_id", len(passed_over), "passed")
            params.update(sql.numbered("passed", passed_over))
        named += sql.DISPATCH_STICKY
        asked = time.monotonic()
        rows = self._lease_rows(named, params)
        # The lease ran in the last outermost store transaction of this thread if the
        # dialect opened one (after its wait for the database), else as one statement.
        leased_at = max(asked, self.db.write_began_at())
        return [
            (Fence(row[0], owner, row[1]), self._leased_head(row, ttl_ms, leased_at))
            for row in rows
        ]

    def _leased_head(self, row: Sequence[Any], ttl_ms: int, leased_at: float) -> InstanceHead:
        event_type, data, empty, ready_ms, expires_ms, taken_over = row[-6:]
        # The lease began at expiry - TTL.
        lag = None if taken_over else max(0, int(expires_ms) - ttl_ms - int(ready_ms))
        return replace(
            self._head(row[2:]),
            parked_value=None if data is None or event_type is None else (event_type, data),
            history_empty=bool(empty),
            dispatch_lag_ms=lag,
            taken_over=bool(taken_over),
            leased_at=leased_at,
        )

    def _lease_rows(self, named: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Lease the candidates; return (id, epoch, *HEAD_COLUMNS, the parked value's
        event type and data (sql.LEASED_PARKED_VALUE), whether the history is empty
        (sql.LEASED_HISTORY_EMPTY), ready_ms, lease_expires_ms,
        whether the lease taken had expired) per leased row.

        ``named`` is the workflow-name, version and sticky condition of both parts;
        ``params`` binds it, the batch size (``limit``) and the lease (``owner``,
        ``ttl_ms``, ``runnable``) by name.
        """
        raise NotImplementedError

    @staticmethod
    def versions_sql(versions: Sequence[str | None]) -> tuple[str, dict[str, Any]]:
        """COMPATIBLE_VERSIONS as a dispatch condition (None: unversioned instances)."""
        named = [v for v in versions if v is not None]
        unversioned = len(named) < len(versions)
        if not named:
            return sql.VERSIONS_NULL, {}
        rest = " OR code_version IS NULL" if unversioned else ""
        marks = sql.marks(len(named), "version")
        return (
            sql.compose(sql.VERSIONS_IN, versions=marks, unversioned=rest),
            sql.numbered("version", named),
        )

    def _head(self, row: Sequence[Any]) -> InstanceHead:
        name, input_value, status, cancel_requested, reason, parent, parent_key = row[:7]
        parked_seq, parked_key, history_generation = row[7:10]
        return InstanceHead(
            workflow_name=name,
            input=input_field().from_db_value(input_value, None, self.db.connection),
            status=status,
            cancel_requested=bool(cancel_requested),
            cancel_reason=reason,
            parent_instance_id=parent,
            parent_key=parent_key,
            parked_seq=int(parked_seq or 0),
            parked_key=str(parked_key or ""),
            history_generation=int(history_generation or 1),
        )

    def _compatible(self, instances: Any) -> Any:
        """Only the instances of COMPATIBLE_VERSIONS (all when it is None)."""
        versions = self.options.compatible_versions
        if versions is None:
            return instances
        allowed = Q(code_version__in=[v for v in versions if v is not None])
        if None in versions:
            allowed |= Q(code_version__isnull=True)
        return instances.filter(allowed)

    @operation
    def acquire(self, instance_id: str, owner: str, ttl: float) -> Fence | None:
        """Lease one instance if it is dispatchable."""
        instances = WorkflowInstance.objects.using(self.db.alias)
        with self.db.atomic():
            if (
                not self._compatible(instances.filter(instance_id=instance_id))
                .dispatchable(self.db.now_expr())
                .update(
                    lease_owner=owner,
                    lease_epoch=F("lease_epoch") + 1,
                    lease_expires_ms=self.db.now_expr(ttl),
                    runnable=False,
                )
            ):
                return None
            epoch = (
                instances.filter(instance_id=instance_id)
                .values_list("lease_epoch", flat=True)
                .get()
            )
        return Fence(instance_id, owner, epoch)

    @operation
    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        """Extend an unexpired matching lease on the database clock."""
        return bool(
            WorkflowInstance.objects.using(self.db.alias)
            .filter(
                instance_id=fence.instance_id,
                lease_owner=fence.owner,
                lease_epoch=fence.epoch,
                status=WorkflowStatus.RUNNING,
                lease_expires_ms__gte=self.db.now_expr(),
            )
            .update(lease_expires_ms=self.db.now_expr(ttl))
        )

    # -- snapshots and commands ---------------------------------------------------------

    @operation
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
        back is then unspecified). A ``head`` whose lease found the history empty
        (an instance's first execution) reads nothing.
        """
        if head is None:
            rows = self.db._fetch(sql.SELECT_HEAD, {"instance_id": instance_id})
            if not rows:
                raise exc.WorkflowNotFound(instance_id)
            head = self._head(rows[0])
        history: list[HistoryRow] = []
        signals: list[SignalPosition] = []
        if head.history_empty:
            rows = []
        elif max_events is None:
            rows = self.db._fetch(sql.SNAPSHOT, {"instance_id": instance_id})
        else:
            rows = self.db._fetch(
                sql.SNAPSHOT_BOUNDED, {"instance_id": instance_id, "limit": max_events + 1}
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
            parked_seq=head.parked_seq,
            parked_key=head.parked_key,
            history_generation=head.history_generation,
        )

    @operation
    def record_command(self, fence: Fence, row: HistoryRow) -> HistoryRow:
        """Record a command's history row under the fence."""
        with self.db.atomic():
            self.db._fence(fence)
            return self.db._insert_row(fence.instance_id, row)

    # -- close --------------------------------------------------------------------------

    @operation
    def close(self, fence: Fence, request: CloseRequest) -> str:
        """Close the instance with everything closing implies, in one fenced transaction.

        Returns the status written (a cancellation without a durable request closes
        as failed).
        """
        with self.db.atomic():
            # Lock order: a child's close takes its parent's row before its own (an
            # ancestor before a descendant, as a parent's close cancelling its children
            # does), and decides there whether the parent still waits for the outcome.
            parent_waits = self.children._wake_waiting_parent(fence.instance_id, request.parent)
            status = request.status
            if status == WorkflowStatus.CANCELLED:
                self.db._fence(fence)
                requested = (
                    WorkflowInstance.objects.using(self.db.alias)
                    .filter(instance_id=fence.instance_id)
                    .values_list("cancel_requested", flat=True)
                    .get()
                )
                if not requested:
                    status = WorkflowStatus.FAILED
            statement, params = self._close_sql(fence, status, request)
            # The fence check and the close are one conditional update.
            if self.db._execute(statement, params) != 1:
                raise self.db._fenced_error(fence)
            self.db.apply_deferred(fence)
            data = request.output if status == WorkflowStatus.COMPLETED else request.error
            self.db._insert_row(fence.instance_id, self._close_row(status, data))
            if request.unfinished:
                self.children._close_cleanup(fence.instance_id)
            self.children._close_cascade(
                fence.instance_id, status, data, children=request.children, parent=parent_waits
            )
            # A waiter in this process reads the row again once the handed-over execution
            # is no longer marked running: unmark it before the wake-up goes out.
            self.db._closed_on_commit(fence.instance_id)
            self.db.after_commit(closed_topic(fence.instance_id))
        return str(status)

    def _close_sql(
        self, fence: Fence, status: str, request: CloseRequest
    ) -> tuple[str, dict[str, Any]]:
        """The fenced close (CLOSE_UPDATE), its values named ``close_*``."""
        error_type = envelope_type(request.error) if status == WorkflowStatus.FAILED else ""
        return sql.CLOSE_UPDATE, {
            "close_status": str(status),
            "close_output": request.output,
            "close_error": request.error,
            "close_error_type": error_type,
            "close_runnable": False,
            "close_at": self.db._now_param(),
            "close_instance_id": fence.instance_id,
            "close_owner": fence.owner,
            "close_epoch": fence.epoch,
            "close_running": str(WorkflowStatus.RUNNING),
        }

    @staticmethod
    def _close_row(status: str, data: str | None) -> HistoryRow:
        return HistoryRow(
            key=CLOSE_KEY,
            seq=None,
            command=CMD_CLOSE,
            event_type=CLOSE_EVENT_BY_STATUS[status],
            data=data,
        )

    # -- instances that cannot go on ----------------------------------------------------

    @operation
    def execution_errors(self, fence: Fence) -> int | None:
        """How many executions in a row ended on a storage error before the one ``fence``
        holds; None when that lease is no longer held (or the instance closed)."""
        rows = self.db._fetch(sql.SELECT_EXECUTION_ERRORS, self.db._fence_params(fence))
        return int(rows[0][0]) if rows else None

    @operation
    def defer_execution(self, fence: Fence, errors: int, delay: float, message: str) -> bool:
        """Release the lease of an execution that ended on a storage error, and hold the
        instance back ``delay`` seconds (database clock), recording ``errors`` (the count
        in a row, this one included) and ``message``, in one fenced update.

        The instance stays runnable; dispatch takes it once ``ready_ms`` has passed,
        and nothing that arrives meanwhile (a signal, a cancel request) brings that
        forward. False when the lease was no longer held.
        """
        return (
            self.db._execute(
                sql.DEFER_EXECUTION,
                {
                    "runnable": True,
                    "delay_ms": round(delay * 1000),
                    "errors": errors,
                    "message": message[:EXECUTION_ERROR_CHARS],
                    "updated_at": self.db._now_param(),
                    **self.db._fence_params(fence),
                },
            )
            == 1
        )

    @operation
    def terminate(
        self,
        instance_id: str,
        error: str,
        closed_by: dict[str, Any],
        *,
        fence: Fence | None = None,
        overdue: bool = False,
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
        With ``overdue``, only while the run is past its execution deadline on the
        database clock (the leader's sweep: :class:`InvalidWorkflowState` when a
        resume gave it a new one meanwhile). Raises :class:`WorkflowNotFound` or
        :class:`InstanceClosed`.
        """
        with self.db.atomic():
            rows = self.db._fetch(sql.SELECT_TERMINATE_HEAD, {"instance_id": instance_id})
            if not rows:
                raise exc.WorkflowNotFound(instance_id)
            status, parent_id, parent_key, workflow_name = rows[0]
            if status != WorkflowStatus.RUNNING:
                raise exc.InstanceClosed.for_status(instance_id, status)
            # Lock order: a waiting parent's row before this one, as a child's close does.
            parent = self.children._wake_waiting_parent(
                instance_id, (str(parent_id), str(parent_key))
            )
            params: dict[str, Any] = {
                "failed": str(WorkflowStatus.FAILED),
                "error": error,
                "error_type": envelope_type(error),
                "runnable": False,
                "closed_at": self.db._now_param(),
                "instance_id": instance_id,
                "running": str(WorkflowStatus.RUNNING),
            }
            guard = "" if fence is None else sql.TERMINATE_FENCED
            if fence is not None:
                params.update(owner=fence.owner, epoch=fence.epoch)
            if overdue:
                guard += sql.TERMINATE_OVERDUE
            statement = sql.compose(sql.TERMINATE_UPDATE, fenced=guard)
            if self.db._execute(statement, params) != 1:
                if fence is not None:
                    raise self.db._fenced_error(fence)
                # Closed by its execution while this transaction waited for the row.
                closed = self.db._fetch(sql.SELECT_STATUS, {"instance_id": instance_id})
                if overdue and closed[0][0] == WorkflowStatus.RUNNING:
                    raise exc.InvalidWorkflowState(
                        instance_id, str(closed[0][0]), f"{instance_id!r} is not overdue"
                    )
                raise exc.InstanceClosed.for_status(instance_id, closed[0][0])
            self.db._insert_row(
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
            self.children._close_cleanup(instance_id, fill=False)
            self.children._close_cascade(
                instance_id, str(WorkflowStatus.FAILED), error, children=True, parent=parent
            )
            self.db._closed_on_commit(instance_id)
            self.db.after_commit(closed_topic(instance_id))
        return str(workflow_name)

    @operation
    def prune_closed(
        self,
        statuses: Collection[str],
        closed_before: datetime,
        workflow_name: str | None,
        limit: int,
    ) -> int:
        """Delete up to ``limit`` instances in ``statuses`` closed before ``closed_before``,
        the earliest closed first, with everything they own; return how many.

        One transaction, whose delete is one IN list of ``limit`` ids at most. A child
        whose parent is still running is kept; ``workflow_name`` is an exact name.
        """
        instances = WorkflowInstance.objects.using(self.db.alias)
        # The parent's row by its key, per candidate (NOT EXISTS): not a NOT IN over every
        # running instance, which read the whole running set for each batch.
        running_parent = instances.filter(
            instance_id=OuterRef("parent_instance_id"), status=WorkflowStatus.RUNNING
        )
        qs = instances.filter(
            ~Exists(running_parent), status__in=sorted(statuses), closed_at__lt=closed_before
        )
        if workflow_name:
            qs = qs.filter(workflow_name=workflow_name)
        with self.db.atomic():
            ids = list(qs.order_by("closed_at").values_list("instance_id", flat=True)[:limit])
            if ids:
                instances.filter(instance_id__in=ids).delete()
        return len(ids)
