"""Reads of the status report: workers, the leader, queues, timers and running instances.

The report (:mod:`selvedge_django.operations.status`) reads the small tables and
the task and timer tables through the ORM, each read one bounded statement on an
index; the reads of running instances are hand-written so that the partial index
each needs is used on both databases: its condition is repeated as literals, and
SQLite is told the index by name
(:meth:`~selvedge_django.storage.sqlite.db.SQLiteDatabase._status_rows`), since without
statistics it prefers the status index and sorts every running instance
instead. Each reads at most ``limit`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count

from ..models import (
    LONG_HISTORY_SEQ,
    ActivityTask,
    ActivityTaskStatus,
    SystemLock,
    TimerSubscription,
    WorkerHeartbeat,
    WorkflowInstance,
    WorkflowStatus,
)
from . import sql
from .db import Database
from .operation import operation

__all__ = ["InstanceState", "StatusReads"]

# A lease expiry later than any lease: "every leased instance".
EVERY_LEASE_MS = 2**62


@dataclass(frozen=True)
class InstanceState:
    """The columns of a running instance that the status report looks at."""

    instance_id: str
    workflow_name: str
    lease_owner: str
    lease_expires_ms: int | None
    ready_ms: int
    lease_epoch: int
    parked_seq: int
    execution_errors: int
    execution_error: str
    generation: int


# The columns of a live worker's heartbeat row that the report shows.
WORKER_COLUMNS = (
    "worker_id",
    "hostname",
    "pid",
    "service_name",
    "code_version",
    "queues",
    "undecodable",
    "started_ms",
    "last_seen_ms",
    "expires_ms",
)


def _count(queryset: Any, limit: int) -> int:
    """How many rows ``queryset`` has, up to ``limit``."""
    return int(queryset.order_by()[:limit].count())


class StatusReads:
    """The status report's bounded reads (``store.status``): running instances through
    their partial indexes, and workers, the leader lock, queues and timers.

    ``now`` is the database clock in Unix milliseconds, read once per report.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.alias = db.alias

    def _states(
        self, template: str, index: str, params: Mapping[str, object]
    ) -> list[InstanceState]:
        return [
            InstanceState(
                instance_id=row[0],
                workflow_name=row[1],
                lease_owner=row[2],
                lease_expires_ms=None if row[3] is None else int(row[3]),
                ready_ms=int(row[4] or 0),
                lease_epoch=int(row[5]),
                parked_seq=int(row[6] or 0),
                execution_errors=int(row[7] or 0),
                execution_error=str(row[8] or ""),
                generation=int(row[9] or 1),
            )
            for row in self.db._status_rows(template, index, params)
        ]

    @operation
    def runnable_instances(self, ready_by_ms: int, limit: int) -> list[InstanceState]:
        """Runnable instances ready by ``ready_by_ms``, the longest waiting first."""
        return self._states(
            sql.STATUS_READY, "sv_inst_ready_idx", {"by_ms": ready_by_ms, "limit": limit}
        )

    @operation
    def count_runnable(self, ready_by_ms: int, limit: int) -> int:
        """How many instances are runnable and ready by ``ready_by_ms``, up to ``limit``."""
        rows = self.db._status_rows(
            sql.STATUS_READY_COUNT, "sv_inst_ready_idx", {"by_ms": ready_by_ms, "limit": limit}
        )
        return int(rows[0][0])

    @operation
    def leased_instances(
        self, expired_before_ms: int = EVERY_LEASE_MS, limit: int = 100
    ) -> list[InstanceState]:
        """Leased instances whose lease expires before ``expired_before_ms``, earliest first."""
        return self._states(
            sql.STATUS_LEASED, "sv_inst_lease_idx", {"before_ms": expired_before_ms, "limit": limit}
        )

    @operation
    def long_histories(self, threshold: int, limit: int) -> list[InstanceState]:
        """Running instances suspended past command position ``threshold``, longest first.

        Indexed when ``threshold`` is at least ``LONG_HISTORY_SEQ``; below it, every
        running instance is read.
        """
        if threshold >= LONG_HISTORY_SEQ:
            template = sql.compose(
                sql.STATUS_LONG_HISTORY, floor=f" AND parked_seq >= {LONG_HISTORY_SEQ}"
            )
            return self._states(
                template, "sv_inst_long_history_idx", {"threshold": threshold, "limit": limit}
            )
        template = sql.compose(sql.STATUS_LONG_HISTORY, floor="")
        return self._states(template, "", {"threshold": threshold, "limit": limit})

    @operation
    def erring_instances(self, limit: int) -> list[InstanceState]:
        """Running instances held back after storage errors, the most errors first."""
        return self._states(
            sql.STATUS_EXECUTION_ERRORS, "sv_inst_exec_errors_idx", {"limit": limit}
        )

    # -- workers and the leader -------------------------------------------------------

    @operation
    def lock_holder(self, name: str, now: int) -> str | None:
        """The owner of the unexpired lock ``name``, or None."""
        owner: str | None = (
            SystemLock.objects.using(self.alias)
            .filter(name=name, expires_ms__gte=now)
            .exclude(owner="")
            .values_list("owner", flat=True)
            .first()
        )
        return owner

    @operation
    def live_workers(self, now: int, limit: int) -> Sequence[Mapping[str, Any]]:
        """The heartbeat rows of live workers (``WORKER_COLUMNS``), the earliest to expire
        first, at most ``limit`` (``sv_worker_expires_idx``)."""
        return list(
            WorkerHeartbeat.objects.using(self.alias)
            .filter(expires_ms__gte=now)
            .order_by("expires_ms")
            .values(*WORKER_COLUMNS)[:limit]
        )

    @operation
    def lost_workers(self, now: int, limit: int) -> Sequence[Mapping[str, Any]]:
        """The expired heartbeat rows (worker_id, hostname, pid, last_seen_ms), the latest
        expired first, at most ``limit``."""
        return list(
            WorkerHeartbeat.objects.using(self.alias)
            .filter(expires_ms__lt=now)
            .order_by("-expires_ms")
            .values("worker_id", "hostname", "pid", "last_seen_ms")[:limit]
        )

    @operation
    def leases_by_owner(self, now: int) -> dict[str, int]:
        """How many live leases each worker holds.

        The partial index holds only running rows, as many as the workers'
        concurrency allows.
        """
        return dict(
            WorkflowInstance.objects.using(self.alias)
            .filter(status=WorkflowStatus.RUNNING, lease_expires_ms__gte=now)
            .exclude(lease_owner="")
            .values_list("lease_owner")
            .annotate(n=Count("instance_id"))
            .order_by()
        )

    @operation
    def claims_by_owner(self, now: int) -> dict[str, int]:
        """How many live activity claims each worker holds (``sv_task_claim_idx``, which
        holds only running tasks)."""
        return dict(
            ActivityTask.objects.using(self.alias)
            .filter(status=ActivityTaskStatus.RUNNING, claim_expires_ms__gte=now)
            .values_list("claim_owner")
            .annotate(n=Count("id"))
            .order_by()
        )

    # -- queues -----------------------------------------------------------------------

    @operation
    def next_queue(self, after: str | None) -> str | None:
        """The first queue of queued tasks after ``after`` (None: the first of all): one
        step along ``sv_task_queue_idx``."""
        queued = ActivityTask.objects.using(self.alias).filter(status=ActivityTaskStatus.QUEUED)
        rest = queued.filter(queue__gt=after) if after is not None else queued
        name: str | None = rest.order_by("queue").values_list("queue", flat=True).first()
        return name

    @operation
    def running_by_queue(self, limit: int) -> dict[str, int]:
        """How many tasks run in each queue, for at most ``limit`` queues."""
        return dict(
            ActivityTask.objects.using(self.alias)
            .filter(status=ActivityTaskStatus.RUNNING)
            .values_list("queue")
            .annotate(n=Count("id"))
            .order_by()[:limit]
        )

    def _queued(self, queue: str) -> Any:
        return ActivityTask.objects.using(self.alias).filter(
            status=ActivityTaskStatus.QUEUED, queue=queue
        )

    @operation
    def oldest_due_task(self, queue: str, now: int) -> tuple[int, datetime] | None:
        """(not_before_ms, created_at) of the queued task of ``queue`` due longest, or None."""
        oldest: tuple[int, datetime] | None = (
            self._queued(queue)
            .filter(not_before_ms__lte=now)
            .order_by("not_before_ms")
            .values_list("not_before_ms", "created_at")
            .first()
        )
        return oldest

    @operation
    def count_queued(self, queue: str, limit: int) -> int:
        """How many tasks are queued in ``queue``, up to ``limit``."""
        return _count(self._queued(queue), limit)

    @operation
    def count_due(self, queue: str, now: int, limit: int) -> int:
        """How many tasks queued in ``queue`` are due, up to ``limit``."""
        return _count(self._queued(queue).filter(not_before_ms__lte=now), limit)

    # -- instances and timers ---------------------------------------------------------

    @operation
    def count_running(self, limit: int) -> int:
        """How many instances are running, up to ``limit``."""
        running = WorkflowInstance.objects.using(self.alias).filter(status=WorkflowStatus.RUNNING)
        return _count(running, limit)

    def _due_timers(self, now: int) -> Any:
        return TimerSubscription.objects.using(self.alias).filter(
            fired=False, held=False, fire_at_ms__lte=now
        )

    @operation
    def oldest_due_timer(self, now: int) -> int | None:
        """When the timer due longest was due (Unix ms), or None (``sv_timer_fire_idx``)."""
        oldest: int | None = (
            self._due_timers(now)
            .order_by("fire_at_ms")
            .values_list("fire_at_ms", flat=True)
            .first()
        )
        return oldest

    @operation
    def count_due_timers(self, now: int, limit: int) -> int:
        """How many timers are due and not fired, up to ``limit``."""
        return _count(self._due_timers(now), limit)
