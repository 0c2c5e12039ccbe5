"""Store operations for leader duties: system locks and activity timeout sweeps."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When

from . import exceptions as exc
from .engine.events import EV_ACTIVITY_FAILED, error_data
from .models import ActivityTask, ActivityTaskStatus, SystemLock
from .store_base import StoreBase

__all__ = ["TaskSweepMixin", "lapse_timeout"]


def lapse_timeout(
    name: str,
    attempt: int,
    deadline_ms: int | None,
    heartbeat_ms: int | None,
    expired_ms: int | None,
) -> exc.ActivityTimeoutError:
    """What a lapsed claim stands for: its attempt deadline, a missed heartbeat, or else
    only the lapse (the worker stopped renewing it: it vanished, stalled or lost the
    database), ``kind="claim_lapsed"``."""
    deadline_reached = deadline_ms is not None and (expired_ms is None or deadline_ms <= expired_ms)
    if deadline_reached:
        kind = "start_to_close"
    elif heartbeat_ms is not None:
        kind = "heartbeat"
    else:
        kind = "claim_lapsed"
    return exc.ActivityTimeoutError(name, kind, attempt)


class TaskSweepMixin(StoreBase):
    """System locks and the leader's activity timeout sweeps."""

    def try_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or renew a named lock; True while ``owner`` holds it."""
        with self.atomic():
            now = self.now_expr()
            updated = (
                SystemLock.objects.using(self.alias)
                .filter(Q(name=name) & (Q(owner=owner) | Q(expires_ms__lt=now)))
                .update(
                    epoch=Case(When(owner=owner, then=F("epoch")), default=F("epoch") + 1),
                    owner=owner,
                    expires_ms=self.now_expr(ttl),
                )
            )
            if updated:
                return True
            if SystemLock.objects.using(self.alias).filter(name=name).exists():
                return False
            try:
                with transaction.atomic(using=self.alias):
                    SystemLock.objects.using(self.alias).create(
                        name=name, owner=owner, epoch=1, expires_ms=self.now_expr(ttl)
                    )
            except IntegrityError:
                return False
            return True

    def unlock(self, name: str, owner: str) -> None:
        SystemLock.objects.using(self.alias).filter(name=name, owner=owner).update(
            owner="", expires_ms=0
        )

    def lock_owner(self, name: str) -> str | None:
        """The current holder of a lock, or None when it is free or expired."""
        row = (
            SystemLock.objects.using(self.alias)
            .filter(name=name, expires_ms__gte=self.now_expr())
            .exclude(owner="")
            .values_list("owner", flat=True)
            .first()
        )
        return row

    def sweep_activity_timeouts(self, limit: int) -> int:
        """Requeue lapsed claims, fail exhausted ones and schedule-to-start timeouts."""
        done = 0
        now = self.now_expr()
        lapsed = list(
            ActivityTask.objects.using(self.alias)
            .filter(status=ActivityTaskStatus.RUNNING, claim_expires_ms__lt=now)
            .order_by("claim_expires_ms")
            .values_list(
                "id",
                "instance_id",
                "claim_epoch",
                "name",
                "attempts",
                "failures",
                "max_attempts",
                "attempt_deadline_ms",
                "heartbeat_timeout_ms",
                "claim_expires_ms",
            )[:limit]
        )
        for task_id, instance_id, epoch, name, attempts, failures, max_attempts, *expiry in lapsed:
            timeout = lapse_timeout(name, attempts, *expiry)
            exhausted = max_attempts != 0 and failures + 1 >= max_attempts
            with self.atomic():
                # The instance row first (the lock order of every write path) when the
                # failure arrives in its history. A row or task another transaction holds
                # (a client's signal still open) waits for the next round: it must not
                # stall the sweep of every other instance.
                if exhausted and not self._lock_instance(instance_id, skip_locked=True):
                    continue
                task = ActivityTask.objects.using(self.alias).filter(
                    id=task_id,
                    claim_epoch=epoch,
                    status=ActivityTaskStatus.RUNNING,
                    claim_expires_ms__lt=self.now_expr(),
                )
                if not self._lock_task(task_id):
                    continue
                if exhausted:
                    final = exc.RetryExhaustedError(name, failures + 1, timeout)
                    row = task.values_list("instance_id", "key").first()
                    if row is None or not task.update(
                        status=ActivityTaskStatus.FAILED,
                        claim_owner="",
                        claim_expires_ms=None,
                        failures=F("failures") + 1,
                        last_error=error_data(timeout),
                    ):
                        continue
                    self._arrive_failure(row[0], row[1], error_data(final))
                else:
                    task.update(
                        status=ActivityTaskStatus.QUEUED,
                        claim_owner="",
                        claim_expires_ms=None,
                        failures=F("failures") + 1,
                        last_error=error_data(timeout),
                        not_before_ms=0,
                        # The wait for a worker starts at the lapse, not at this sweep
                        # (SET expressions read the row as it was before the update).
                        schedule_deadline_ms=Case(
                            When(
                                schedule_to_start_ms__isnull=False,
                                then=F("claim_expires_ms") + F("schedule_to_start_ms"),
                            ),
                            default=Value(None),
                        ),
                    )
                    self.after_commit("task")
            done += 1
        overdue = list(
            ActivityTask.objects.using(self.alias)
            .filter(status=ActivityTaskStatus.QUEUED, schedule_deadline_ms__lt=now)
            .order_by("schedule_deadline_ms")
            .values_list("id", "instance_id", "key", "name", "attempts")[:limit]
        )
        for task_id, instance_id, key, name, attempts in overdue:
            error = error_data(exc.ActivityTimeoutError(name, "schedule_to_start", attempts))
            with self.atomic():
                if not (
                    self._lock_instance(instance_id, skip_locked=True) and self._lock_task(task_id)
                ):
                    continue
                if (
                    not ActivityTask.objects.using(self.alias)
                    .filter(
                        id=task_id,
                        status=ActivityTaskStatus.QUEUED,
                        schedule_deadline_ms__lt=self.now_expr(),
                    )
                    .update(status=ActivityTaskStatus.FAILED, last_error=error)
                ):
                    continue
                self._arrive_failure(instance_id, key, error)
            done += 1
        return done

    def _lock_task(self, task_id: int) -> bool:
        """Lock a task row unless another transaction holds it (PostgreSQL; else True)."""
        if self.vendor != "postgresql":
            return True
        return bool(
            self._fetch(
                "SELECT 1 FROM {task} WHERE id = %s FOR NO KEY UPDATE SKIP LOCKED", [task_id]
            )
        )

    def _lapse_envelope(self, task: ActivityTask, attempt: int) -> str:
        """The error of a lapsed claim (attempt ``attempt``) taken over by a new one."""
        timeout = lapse_timeout(
            task.name,
            attempt,
            task.attempt_deadline_ms,
            task.heartbeat_timeout_ms,
            task.claim_expires_ms,
        )
        return error_data(timeout)

    def _arrive_failure(self, instance_id: str, key: str, data: str) -> None:
        from django.utils import timezone

        from .models import HistoryEvent, WorkflowInstance, WorkflowStatus

        HistoryEvent.objects.using(self.alias).filter(
            instance_id=instance_id, key=key, data__isnull=True
        ).update(event_type=EV_ACTIVITY_FAILED, data=data, arrived_at=timezone.now())
        WorkflowInstance.objects.using(self.alias).filter(
            instance_id=instance_id, status=WorkflowStatus.RUNNING
        ).update(**self.wake_fields())
        self.after_commit("runnable")
