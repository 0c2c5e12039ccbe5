"""Activity tasks, one aggregate: reservation, claims, outcomes, renewal of one claim.

A task row belongs to one history key of one instance. Every write of an
attempt's outcome is fenced by the claim (owner, claim epoch) and, where the
outcome arrives in the instance's history, takes the instance row first (the
lock order of every write path). Claims expire on the database clock. The
leader's timeout sweeps are in :mod:`.task_timeouts`, batch renewals in
:mod:`.renewals`, the claim's candidates and flow control limits in :mod:`.flow_control`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.db.models import Case, F, Q, Value, When

from .. import exceptions as exc
from ..engine.events import (
    EV_ACTIVITY_CANCELLED,
    EV_ACTIVITY_COMPLETED,
    EV_ACTIVITY_FAILED,
    Fence,
    HistoryRow,
    error_data,
)
from ..engine.ports import ClaimedTask, TaskClaim, TaskSpec
from ..models import ActivityTask, ActivityTaskStatus
from . import sql
from .db import Database
from .flow_control import Limits
from .inline import Inline
from .lapses import lapsed_task_error
from .operation import operation
from .options import StoreOptions
from .task_rows import task_fields, waited_ms
from .wakeups import TOPIC_TASK

__all__ = ["Tasks"]


class Tasks:
    """Activity tasks: reserve with the command, claim, record outcomes, renew one claim
    (``store.tasks``); claims pass flow control through ``limits``, and the results
    ``inline`` holds are recorded here (:meth:`_apply_deferred`, the database's hook)."""

    def __init__(
        self, db: Database, options: StoreOptions, *, limits: Limits, inline: Inline
    ) -> None:
        self.db = db
        self.options = options
        self.limits = limits
        self.inline = inline

    def _claim_ttl(self, start_to_close: float | None, heartbeat: float | None) -> float:
        ttl = self.options.lease_ttl
        if heartbeat is not None:
            ttl = min(ttl, heartbeat)
        if start_to_close is not None:
            ttl = min(ttl, start_to_close)
        return ttl

    @operation
    def claim_tasks(self, owner: str, limit: int, names: Sequence[str]) -> list[ClaimedTask]:
        """Claim up to ``limit`` due tasks of registered activities, by priority and age.

        sql.TASK_RANK order (a minute waited is worth a point). Tasks of a key at its
        ``max_concurrency`` and of full rate-limited queues are skipped; the rest are
        counted against their limits under the limits' locks (:meth:`Limits._within_limits`)
        and the rate-limited claims recorded, in the claim's transaction.
        """
        if limit <= 0 or not names or self.options.activity_queues == ():
            return []
        if not self.db._worth_writing(*self.limits._claim_probe(names)):
            return []
        statement, params = self.limits._claim_pick(names, limit)
        with self.db.atomic():
            rows = [
                (int(r[0]), str(r[1]), str(r[2]), r[3]) for r in self.db._fetch(statement, params)
            ]
            taken, limited = self.limits._within_limits(rows)
            claimed = self._take_claims(taken, owner)
            self.limits._record_queue_claims(limited)
            return claimed

    @operation
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
        fields = task_fields(fence, row, task, self.db.now_sql())
        if claim_owner is not None:
            fields.update(
                status=ActivityTaskStatus.RUNNING,
                attempts=1,
                claim_owner=claim_owner,
                claim_epoch=1,
                claim_expires_ms=self.db.now_sql(ttl),
                claim_started_ms=self.db.now_sql(),
                attempt_deadline_ms=None
                if task.start_to_close_timeout is None
                else self.db.now_sql(task.start_to_close_timeout),
            )
        else:
            fields.update(
                status=ActivityTaskStatus.QUEUED,
                schedule_deadline_ms=None
                if task.schedule_to_start_timeout is None
                else self.db.now_sql(task.schedule_to_start_timeout),
            )
        current_step = f"activity {task.name}"
        guarded = observe_cancel and claim_owner is not None
        claimed_at = time.monotonic()
        try:
            task_id = self._reserve(fence, row, fields, current_step, release, guarded)
        except exc.Fenced:
            reason = self.db._cancel_reason_under(fence) if guarded else None
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
            queue=task.queue,
            waited_ms=0,
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
        with self.db.atomic():
            self.db._fence(
                fence,
                current_step=current_step,
                release=release,
                uncancelled=uncancelled,
                parked=self._parked_at(row),
            )
            self.db._insert_row(fence.instance_id, row)
            task_id = int(self.db._insert(ActivityTask, fields, returning_id=True))
            if queued:
                self.db.after_commit(TOPIC_TASK)
        return task_id

    @staticmethod
    def _parked_at(row: HistoryRow) -> tuple[int, str] | None:
        """Where an execution whose reservation releases its lease waits: at ``get()``
        of that reservation (what ``parked_seq`` and ``parked_key`` record)."""
        return None if row.seq is None else (row.seq, row.key)

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
        fields = {
            **task_fields(fence, row, task, self.db.now_sql()),
            "status": ActivityTaskStatus.CANCELLED,
        }
        self._reserve(fence, cancelled, fields, current_step, release=False)
        return cancelled

    def _claimable(self) -> Any:
        """The tasks an activity worker may claim now, in the queues this store serves."""
        qs = ActivityTask.objects.using(self.db.alias).claimable(self.db.now_expr())
        if self.options.activity_queues is not None:
            qs = qs.filter(queue__in=list(self.options.activity_queues))
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
        statement, params = self.db._bound(
            sql.compose(sql.CLAIM_ROWS, ids=sql.marks(len(ids), "task")), sql.numbered("task", ids)
        )
        before = list(ActivityTask.objects.using(self.db.alias).raw(statement, params))
        ttls: dict[int, tuple[float, float | None, float | None]] = {}
        fresh: dict[tuple[float, float | None], list[int]] = {}
        for task in before:
            start_to_close = task.start_to_close_ms / 1000 if task.start_to_close_ms else None
            heartbeat = task.heartbeat_timeout_ms / 1000 if task.heartbeat_timeout_ms else None
            ttl = self._claim_ttl(start_to_close, heartbeat)
            ttls[task.id] = (ttl, start_to_close, heartbeat)
            if task.claim_expires_ms is None:
                fresh.setdefault((ttl, start_to_close), []).append(task.id)
                continue
            # A lapsed claim taken over: its lapse is counted as a failure here.
            ActivityTask.objects.using(self.db.alias).filter(id=task.id).update(
                status=ActivityTaskStatus.RUNNING,
                attempts=F("attempts") + 1,
                claim_owner=owner,
                claim_epoch=F("claim_epoch") + 1,
                claim_started_ms=self.db.now_expr(),
                schedule_deadline_ms=None,
                claim_expires_ms=self.db.now_expr(ttl),
                attempt_deadline_ms=self.db.now_expr(start_to_close) if start_to_close else None,
                failures=F("failures") + 1,
                last_error=lapsed_task_error(task, task.attempts),
            )
        for (ttl, start_to_close), group in fresh.items():
            # The tasks no claim held before: one update for those of one claim length.
            self.db._execute(
                sql.compose(sql.CLAIM_FRESH, ids=sql.marks(len(group), "task")),
                {
                    "running": str(ActivityTaskStatus.RUNNING),
                    "owner": owner,
                    "ttl_ms": round(ttl * 1000),
                    "has_deadline": start_to_close is not None,
                    "deadline_ms": round((start_to_close or 0) * 1000),
                    **sql.numbered("task", group),
                },
            )
        read_back = {
            task_id: (epoch, attempts, failures, started_ms)
            for task_id, epoch, attempts, failures, started_ms in self.db._fetch(
                sql.compose(sql.CLAIMED_BACK, ids=sql.marks(len(ids), "task")),
                {"owner": owner, **sql.numbered("task", ids)},
            )
        }
        claimed: list[ClaimedTask] = []
        for task in before:
            if task.id not in read_back:
                continue
            epoch, attempts, failures, started_ms = read_back[task.id]
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
                    heartbeat_details=task.heartbeat_details,
                    queue=task.queue,
                    waited_ms=waited_ms(task, started_ms),
                    taken_over=task.claim_expires_ms is not None,
                )
            )
        return claimed

    @operation
    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        """Claim one task of an instance inline, if due, servable here and next in its queue.

        A task under a concurrency limit or in a rate-limited queue is left to
        :meth:`claim_tasks`, which counts them; so is a task that the claim order puts
        behind another due task of its queue (sql.INLINE_NEXT): waiting for a result
        does not jump the queue. Held tasks and paused queues are never taken.
        """
        names = self.options.activity_names()
        with self.db.atomic():
            qs = self._claimable().filter(instance_id=instance_id, key=key, concurrency_key="")
            qs = qs.exclude(queue__in=self.limits._inline_skipped_queues())
            if names is not None:
                qs = qs.filter(name__in=list(names))
            qs = qs.filter(self.limits._next_in_queue(names))
            ids = list(
                qs.order_by().select_for_update(skip_locked=True).values_list("id", flat=True)[:1]
            )
            claimed = self._take_claims(ids, owner)
        return claimed[0] if claimed else None

    def _claim_filter(self, claim: TaskClaim, *, live: bool = False) -> Any:
        """The task row an attempt still owns; ``live`` also requires an unexpired claim.

        Every write of an attempt's outcome (complete, fail, retry, release) asks for a
        live claim: a lapsed one goes through the lapse path instead (the lapse counts
        as a failure and the task is claimable again at once, without backoff), so a
        late attempt's error never becomes the outcome, nor its backoff the wait.
        """
        qs = ActivityTask.objects.using(self.db.alias).filter(
            id=claim.task_id,
            claim_owner=claim.owner,
            claim_epoch=claim.epoch,
            status=ActivityTaskStatus.RUNNING,
        )
        if live:
            qs = qs.filter(claim_expires_ms__gte=self.db.now_expr())
        return qs

    def _arrive_record(
        self, claim: TaskClaim, event_type: str, data: str
    ) -> tuple[str, dict[str, Any]]:
        """The history value of an outcome, into the row still waiting for it
        (``arrive_*``)."""
        return sql.ARRIVE_HISTORY, {
            "arrive_data": data,
            "arrive_event_type": event_type,
            "arrive_at": self.db._now_param(),
            "arrive_instance_id": claim.instance_id,
            "arrive_key": claim.key,
        }

    @staticmethod
    def _not_held_by(inline_fence: Fence | None) -> tuple[str, dict[str, Any]]:
        """The wake condition of an arrival: the execution that ran the attempt inline
        reads the value itself; any other holder (or none) must be woken."""
        if inline_fence is None:
            return "", {}
        return sql.NOT_HELD_BY, {"held_owner": inline_fence.owner, "held_epoch": inline_fence.epoch}

    def _arrive(
        self, claim: TaskClaim, event_type: str, data: str, inline_fence: Fence | None
    ) -> None:
        """An outcome arriving: the history value, then the wake of the instance."""
        record, params = self._arrive_record(claim, event_type, data)
        self.db._execute(record, params)
        self.db._wake(claim.instance_id, *self._not_held_by(inline_fence))

    def _complete_sql(self, claim: TaskClaim) -> tuple[str, dict[str, Any]]:
        """The claim-checked update that completes a task (``complete_*``, ``claim_*``)."""
        return sql.COMPLETE_TASK, {
            "complete_status": str(ActivityTaskStatus.COMPLETED),
            "claim_task_id": claim.task_id,
            "claim_owner": claim.owner,
            "claim_epoch": claim.epoch,
            "claim_running": str(ActivityTaskStatus.RUNNING),
        }

    @operation
    def complete_task(
        self,
        claim: TaskClaim,
        output: str,
        *,
        inline_fence: Fence | None = None,
        if_free: bool = False,
    ) -> bool:
        """Record a successful attempt; False when the claim was lost (late result).

        ``if_free`` (one of several writes in one transaction, the worker's group
        commit): raise RowBusy, writing nothing, rather than wait for a row another
        transaction holds (databases with row locks); the attempt then writes alone.
        """
        complete, params = self._complete_sql(claim)
        with self.db.atomic():
            self.db._lock_instance(claim.instance_id)
            if not self.db._execute(complete, params):
                return False
            self._arrive(claim, EV_ACTIVITY_COMPLETED, output, inline_fence)
        return True

    @operation
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
        with self.db.atomic():
            self.db._lock_instance(claim.instance_id)
            if not self._claim_filter(claim, live=True).update(
                status=ActivityTaskStatus.FAILED,
                claim_expires_ms=None,
                last_error=error if last_error is None else last_error,
                failures=F("failures") + (1 if count_failure else 0),
            ):
                return False
            self._arrive(claim, EV_ACTIVITY_FAILED, error, inline_fence)
        return True

    @operation
    def retry_task(
        self, claim: TaskClaim, error: str, delay: float, *, details: str | None = None
    ) -> bool:
        """Return the task of a live claim to the queue with one more failure and a
        not-before time (False for a lost or lapsed claim).

        ``details`` (JSON text) are the attempt's latest heartbeat details, stored by
        the same update for the next attempt; None keeps what renewals stored.
        """
        with self.db.atomic():
            if not self._claim_filter(claim, live=True).update(
                **self._details_field(details),
                status=ActivityTaskStatus.QUEUED,
                claim_owner="",
                claim_expires_ms=None,
                failures=F("failures") + 1,
                last_error=error,
                not_before_ms=self.db.now_expr(delay),
                schedule_deadline_ms=Case(
                    When(
                        schedule_to_start_ms__isnull=False,
                        then=self.db.now_expr(delay) + F("schedule_to_start_ms"),
                    ),
                    default=Value(None),
                ),
            ):
                return False
            self.db.after_commit(TOPIC_TASK)
        return True

    @operation
    def release_task(
        self, claim: TaskClaim, *, details: str | None = None, delay_ms: int = 0
    ) -> bool:
        """Give a live claim back (shutdown): no failure counted, claimable again at once
        (or after ``delay_ms``). A lapsed claim is refused: its lapse was already a
        failure. ``details`` as for :meth:`retry_task`.
        """
        with self.db.atomic():
            released = self._claim_filter(claim, live=True).update(
                **self._details_field(details),
                status=ActivityTaskStatus.QUEUED,
                claim_owner="",
                claim_expires_ms=None,
                not_before_ms=self.db.now_expr(delay_ms / 1000) if delay_ms else 0,
                schedule_deadline_ms=Case(
                    When(
                        schedule_to_start_ms__isnull=False,
                        then=self.db.now_expr() + F("schedule_to_start_ms"),
                    ),
                    default=Value(None),
                ),
            )
            if released:
                self.db.after_commit(TOPIC_TASK)
        return bool(released)

    @staticmethod
    def _details_field(details: str | None) -> dict[str, Any]:
        """The heartbeat details column of an update, when there are details to store."""
        return {} if details is None else {"heartbeat_details": details}

    @operation
    def renew_task(self, claim: TaskClaim, ttl: float) -> bool:
        """Extend a live claim, never past the attempt's start-to-close deadline."""
        expires = self.db.now_expr(ttl)
        return bool(
            self._claim_filter(claim)
            .filter(claim_expires_ms__gte=self.db.now_expr())
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

    @operation
    def claim_alive(self, claim: TaskClaim) -> bool:
        return self._claim_filter(claim).exists()

    @operation
    def claim_live(self, claim: TaskClaim) -> bool:
        """Whether ``claim`` is still its attempt's and unexpired."""
        return bool(self._claim_filter(claim, live=True).exists())

    @operation
    def extend_claim_under_lock(self, claim: TaskClaim, ttl: float) -> bool:
        """Extend a claim still this attempt's, expired or not, within its deadline (SQLite).

        Only for a transaction that holds SQLite's write lock since it found the claim
        live (a transactional attempt): nobody else could write since then, so nobody
        can have acted on the claim's expiry, and the extension is the renewal the
        renewer could not make. Never past the attempt's start-to-close deadline: an
        attempt past it has timed out.
        """
        now = self.db.now_expr()
        expires = self.db.now_expr(ttl)
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

    @operation
    def next_task_due_ms(self, names: Sequence[str]) -> int | None:
        """Milliseconds until the next queued task becomes due (None: nothing queued)."""
        if not names:
            return None
        qs = ActivityTask.objects.using(self.db.alias).filter(
            status=ActivityTaskStatus.QUEUED, name__in=list(names), held=False
        )
        if self.options.activity_queues is not None:
            qs = qs.filter(queue__in=list(self.options.activity_queues))
        qs = qs.exclude(queue__in=sorted(self.limits.pauses.paused_queue_names()))
        first = qs.order_by("not_before_ms").values_list("not_before_ms", flat=True).first()
        if first is None:
            return None
        return max(0, first - self.db.now_ms())

    @operation
    def list_tasks(self, instance_id: str) -> list[ActivityTask]:
        """An instance's tasks in issue order."""
        return list(
            ActivityTask.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .order_by("seq", "id")
        )

    def _apply_deferred(self, fence: Fence) -> None:
        """Record the inline results held for ``fence``, inside its write's transaction,
        just after the fence check (:meth:`Inline._apply_deferred`)."""
        self.inline._apply_deferred(fence, self._record_inline)

    def _record_inline(self, claim: TaskClaim, output: str, fence: Fence) -> bool:
        """The claim-checked completion and the history value (no wake-up: the execution
        holding ``fence`` reads it itself); False when the claim lapsed."""
        complete, params = self._complete_sql(claim)
        if not self.db._execute(complete, params):
            return False
        record, record_params = self._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        self.db._execute(record, record_params)
        return True
