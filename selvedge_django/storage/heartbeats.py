"""Worker heartbeats: each worker's row, written on the database clock.

A worker says it is alive by renewing its row (:meth:`Heartbeats.beat_worker`)
every ``LEADER_HEARTBEAT_INTERVAL``, with an expiry ``LEADER_LEASE_DURATION``
later, as the leader lock is renewed; the status report (``runselvedge status``,
the health view) counts the rows not yet expired as the workers alive. Nothing
else reads them: no durable step depends on a heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction

from ..models import WorkerHeartbeat
from .db import Database
from .operation import operation

__all__ = ["Heartbeats", "WorkerInfo"]


class WorkerInfo:
    """What a worker's row says about it besides its id and times."""

    __slots__ = ("code_version", "hostname", "pid", "queues", "service_name", "undecodable")

    def __init__(
        self,
        hostname: str,
        pid: int,
        service_name: str = "",
        code_version: str | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        self.hostname = hostname[:255]
        self.pid = pid
        self.service_name = service_name[:255]
        self.code_version = code_version
        self.queues = None if queues is None else list(queues)
        # The instances the worker cannot decode (worker.undecodable), set at each beat.
        self.undecodable: list[dict[str, str]] | None = None


class Heartbeats:
    """Write, delete and expire worker heartbeat rows (``store.heartbeats``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def beat_worker(self, worker_id: str, info: WorkerInfo, ttl: float) -> None:
        """Record that ``worker_id`` is alive now, until ``ttl`` seconds from now."""
        rows = WorkerHeartbeat.objects.using(self.db.alias)
        fields = {
            "hostname": info.hostname,
            "pid": info.pid,
            "service_name": info.service_name,
            "code_version": info.code_version,
            "queues": info.queues,
            "undecodable": info.undecodable or None,
        }
        with self.db.atomic():
            if rows.filter(worker_id=worker_id).update(
                last_seen_ms=self.db.now_expr(), expires_ms=self.db.now_expr(ttl), **fields
            ):
                return
            try:
                with transaction.atomic(using=self.db.alias):
                    rows.create(
                        worker_id=worker_id,
                        started_ms=self.db.now_expr(),
                        last_seen_ms=self.db.now_expr(),
                        expires_ms=self.db.now_expr(ttl),
                        **fields,
                    )
            except IntegrityError:  # another start of the same id won: its row stands
                pass

    @operation
    def forget_worker(self, worker_id: str) -> None:
        """Delete the row of a worker that stopped gracefully."""
        WorkerHeartbeat.objects.using(self.db.alias).filter(worker_id=worker_id).delete()

    @operation
    def prune_workers(self, expired_for: float, limit: int) -> int:
        """Delete up to ``limit`` rows that expired more than ``expired_for`` seconds ago."""
        rows = WorkerHeartbeat.objects.using(self.db.alias)
        with self.db.atomic():
            ids = list(
                rows.filter(expires_ms__lt=self.db.now_expr(-expired_for))
                .order_by("expires_ms")
                .values_list("worker_id", flat=True)[:limit]
            )
            if ids:
                rows.filter(worker_id__in=ids).delete()
        return len(ids)
