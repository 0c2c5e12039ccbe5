"""The leader's activity timeout sweeps: lapsed claims, exhausted retries, schedule-to-start.

Each task is handled in its own transaction that takes the instance row first
when the failure arrives in its history; rows another transaction holds are
skipped (not waited for) and handled at the next round.
"""

from __future__ import annotations

from django.db.models import Case, F, Value, When
from django.utils import timezone

from .. import exceptions as exc
from .. import metrics
from ..engine.events import EV_ACTIVITY_FAILED, error_data
from ..models import ActivityTask, ActivityTaskStatus, HistoryEvent
from .db import Database
from .lapses import lapse_error_data, lapse_timeout
from .operation import operation
from .wakeups import TOPIC_TASK

__all__ = ["TaskTimeouts"]


class TaskTimeouts:
    """Timeouts of activity tasks, recorded by the leader (``store.task_timeouts``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def sweep_activity_timeouts(self, limit: int) -> int:
        """Requeue lapsed claims, fail exhausted ones and schedule-to-start timeouts."""
        done = 0
        now = self.db.now_expr()
        lapsed = list(
            ActivityTask.objects.using(self.db.alias)
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
                "claim_owner",
                "last_error",
            )[:limit]
        )
        for (
            task_id,
            instance_id,
            epoch,
            name,
            attempts,
            failures,
            max_attempts,
            deadline_ms,
            heartbeat_ms,
            expired_ms,
            lost_owner,
            previous,
        ) in lapsed:
            timeout = lapse_timeout(name, attempts, deadline_ms, heartbeat_ms, expired_ms)
            lapse_error = lapse_error_data(timeout, lost_owner, previous)
            exhausted = max_attempts != 0 and failures + 1 >= max_attempts
            with self.db.atomic():
                # The instance row first (the lock order of every write path) when the
                # failure arrives in its history. A row or task another transaction holds
                # (a client's signal still open) waits for the next round: it must not
                # stall the sweep of every other instance.
                if exhausted and not self.db._lock_instance(instance_id, skip_locked=True):
                    continue
                task = ActivityTask.objects.using(self.db.alias).filter(
                    id=task_id,
                    claim_epoch=epoch,
                    status=ActivityTaskStatus.RUNNING,
                    claim_expires_ms__lt=self.db.now_expr(),
                )
                if not self.db._lock_task(task_id):
                    continue
                if exhausted:
                    final = exc.RetryExhaustedError(name, failures + 1, timeout)
                    row = task.values_list("instance_id", "key").first()
                    if row is None or not task.update(
                        status=ActivityTaskStatus.FAILED,
                        claim_owner="",
                        claim_expires_ms=None,
                        failures=F("failures") + 1,
                        last_error=lapse_error,
                    ):
                        continue
                    self._arrive_failure(row[0], row[1], error_data(final))
                else:
                    task.update(
                        status=ActivityTaskStatus.QUEUED,
                        claim_owner="",
                        claim_expires_ms=None,
                        failures=F("failures") + 1,
                        last_error=lapse_error,
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
                    self.db.after_commit(TOPIC_TASK)
            _count_timeout(name, timeout.kind, exhausted)
            done += 1
        overdue = list(
            ActivityTask.objects.using(self.db.alias)
            .filter(status=ActivityTaskStatus.QUEUED, schedule_deadline_ms__lt=now)
            .order_by("schedule_deadline_ms")
            .values_list("id", "instance_id", "key", "name", "attempts")[:limit]
        )
        for task_id, instance_id, key, name, attempts in overdue:
            error = error_data(exc.ActivityTimeoutError(name, "schedule_to_start", attempts))
            with self.db.atomic():
                if not (
                    self.db._lock_instance(instance_id, skip_locked=True)
                    and self.db._lock_task(task_id)
                ):
                    continue
                if (
                    not ActivityTask.objects.using(self.db.alias)
                    .filter(
                        id=task_id,
                        status=ActivityTaskStatus.QUEUED,
                        schedule_deadline_ms__lt=self.db.now_expr(),
                    )
                    .update(status=ActivityTaskStatus.FAILED, last_error=error)
                ):
                    continue
                self._arrive_failure(instance_id, key, error)
            _count_timeout(name, "schedule_to_start", True)
            done += 1
        return done

    def _arrive_failure(self, instance_id: str, key: str, data: str) -> None:
        """A timeout's failure arriving in the history row, and the instance's wake-up."""
        HistoryEvent.objects.using(self.db.alias).filter(
            instance_id=instance_id, key=key, data__isnull=True
        ).update(event_type=EV_ACTIVITY_FAILED, data=data, arrived_at=timezone.now())
        self.db._wake(instance_id)


def _count_timeout(name: str, kind: str, final: bool) -> None:
    """The metrics of a timeout the sweep recorded (after its commit)."""
    metrics.record(metrics.ACTIVITY_TIMEOUTS, 1, activity_name=name, timeout_kind=kind)
    metrics.record(
        metrics.ACTIVITY_FAILURES if final else metrics.ACTIVITY_RETRIES, 1, activity_name=name
    )
