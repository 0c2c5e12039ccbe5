"""Reads of the status report that need a partial index of the instance table.

The report (:mod:`selvedge_django.operations.status`) reads the small tables and
the task and timer tables through the ORM; these reads of running instances are
hand-written so that the partial index each needs is used on both databases:
its condition is repeated as literals, and SQLite is told the index by name
(:meth:`~selvedge_django.storage.sqlite.db.SQLiteDatabase._status_rows`), since
without statistics it prefers the status index and sorts every running instance
instead. Each reads at most ``limit`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import LONG_HISTORY_SEQ
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


class StatusReads:
    """Bounded, index-backed reads of running instances for the status report
    (``store.status``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _states(self, template: str, index: str, params: list[object]) -> list[InstanceState]:
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
        return self._states(sql.STATUS_READY, "sv_inst_ready_idx", [ready_by_ms, limit])

    @operation
    def count_runnable(self, ready_by_ms: int, limit: int) -> int:
        """How many instances are runnable and ready by ``ready_by_ms``, up to ``limit``."""
        rows = self.db._status_rows(
            sql.STATUS_READY_COUNT, "sv_inst_ready_idx", [ready_by_ms, limit]
        )
        return int(rows[0][0])

    @operation
    def leased_instances(
        self, expired_before_ms: int = EVERY_LEASE_MS, limit: int = 100
    ) -> list[InstanceState]:
        """Leased instances whose lease expires before ``expired_before_ms``, earliest first."""
        return self._states(sql.STATUS_LEASED, "sv_inst_lease_idx", [expired_before_ms, limit])

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
            return self._states(template, "sv_inst_long_history_idx", [threshold, limit])
        template = sql.compose(sql.STATUS_LONG_HISTORY, floor="")
        return self._states(template, "", [threshold, limit])

    @operation
    def erring_instances(self, limit: int) -> list[InstanceState]:
        """Running instances held back after storage errors, the most errors first."""
        return self._states(sql.STATUS_EXECUTION_ERRORS, "sv_inst_exec_errors_idx", [limit])
