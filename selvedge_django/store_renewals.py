"""Renewals of every lease and claim a worker holds, never waiting for someone else's lock.

A client's transaction that signals or cancels an instance holds the instance's
row until the client commits; an execution's own write holds it for a moment.
A renewal that waited for such a row would stall every other renewal behind it,
so leases and claims lapse that nobody else was touching. On PostgreSQL each
batch is one statement that locks the rows it can with ``SKIP LOCKED`` and
reports the rows it skipped as *busy*: the caller tries them again at its next
round. On SQLite there are no row locks: one write transaction renews the whole
batch (it waits for the database's write lock like every writer does, which is
why a long write transaction there holds up every lease; see docs/deployment.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .engine.events import Fence
from .engine.ports import TaskClaim
from .models import ActivityTaskStatus, WorkflowStatus
from .store_base import StoreBase

__all__ = ["RENEWAL_BATCH", "RenewalMixin"]

# Rows per renewal statement (two or three parameters each).
RENEWAL_BATCH = 200

# What a renewal reports per lease or claim: True renewed, False lost (taken over,
# released, closed, cancelled or expired), None busy (PostgreSQL: the row is locked by
# another transaction and was skipped; try again soon).
Renewal = bool | None


class RenewalMixin(StoreBase):
    """Batch renewals of leases and claims."""

    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> dict[Fence, Renewal]:
        """Extend every unexpired matching lease of ``fences`` by ``ttl`` on the database clock.

        Returns, per fence, True (renewed), False (lost) or None (the instance row is
        locked by another transaction, PostgreSQL only: skipped, not waited for).
        """
        results: dict[Fence, Renewal] = {}
        for start in range(0, len(fences), RENEWAL_BATCH):
            chunk = list(fences[start : start + RENEWAL_BATCH])
            match = " OR ".join(
                ["(instance_id = %s AND lease_epoch = %s AND lease_owner = %s)"] * len(chunk)
            )
            params: list[Any] = []
            for fence in chunk:
                params += [fence.instance_id, fence.epoch, fence.owner]
            where, where_params = self._live(f"({match})", params, "lease_expires_ms")
            where += " AND status = %s"
            where_params.append(str(WorkflowStatus.RUNNING))
            now = self.now_sql()
            set_sql = f"lease_expires_ms = {now.sql} + %s"
            set_params = [*now.params, round(ttl * 1000)]
            rows = self._renew(
                "{instance}", "instance_id, lease_epoch", where, where_params, set_sql, set_params
            )
            state = {(row[0], int(row[1])): bool(row[2]) for row in rows}
            for fence in chunk:
                renewed = state.get((fence.instance_id, fence.epoch))
                results[fence] = False if renewed is None else (True if renewed else None)
        return results

    def renew_claims(self, claims: Sequence[tuple[TaskClaim, float]]) -> dict[TaskClaim, Renewal]:
        """Extend every live claim of ``claims`` by its TTL, never past its attempt's deadline.

        ``claims`` pairs each claim with its TTL in seconds. Returns, per claim, True
        (renewed), False (lost: expired, taken over, finished or cancelled) or None (the
        task row is locked by another transaction, PostgreSQL only).
        """
        results: dict[TaskClaim, Renewal] = {}
        for start in range(0, len(claims), RENEWAL_BATCH):
            chunk = list(claims[start : start + RENEWAL_BATCH])
            match = " OR ".join(
                ["(id = %s AND claim_epoch = %s AND claim_owner = %s)"] * len(chunk)
            )
            params: list[Any] = []
            ttl_cases: list[Any] = []
            for claim, ttl in chunk:
                params += [claim.task_id, claim.epoch, claim.owner]
                ttl_cases += [claim.task_id, round(ttl * 1000)]
            where, where_params = self._live(f"({match})", params, "claim_expires_ms")
            where += " AND status = %s"
            where_params.append(str(ActivityTaskStatus.RUNNING))
            now = self.now_sql()
            ttl_sql = "CASE id" + " WHEN %s THEN CAST(%s AS BIGINT)" * len(chunk) + " END"
            expires = f"({now.sql} + {ttl_sql})"
            expires_params = [*now.params, *ttl_cases]
            # NULL < x is not true: a task without an attempt deadline gets the full TTL.
            set_sql = (
                f"claim_expires_ms = CASE WHEN attempt_deadline_ms < {expires}"
                f" THEN attempt_deadline_ms ELSE {expires} END"
            )
            rows = self._renew(
                "{task}",
                "id, claim_epoch",
                where,
                where_params,
                set_sql,
                [*expires_params, *expires_params],
            )
            state = {(int(row[0]), int(row[1])): bool(row[2]) for row in rows}
            for claim, _ in chunk:
                renewed = state.get((claim.task_id, claim.epoch))
                results[claim] = False if renewed is None else (True if renewed else None)
        return results

    def _live(self, match: str, params: list[Any], expires_column: str) -> tuple[str, list[Any]]:
        now = self.now_sql()
        return f"{match} AND {expires_column} >= {now.sql}", [*params, *now.params]

    def _renew(
        self,
        table: str,
        columns: str,
        where: str,
        where_params: list[Any],
        set_sql: str,
        set_params: list[Any],
    ) -> list[tuple[Any, ...]]:
        """Renew the rows of ``table`` matching ``where``; return (*columns, renewed) per
        matching row, renewed false for a row another transaction holds (PostgreSQL)."""
        key = columns.split(",")[0].strip()
        if self.vendor == "postgresql":
            # The locking read skips held rows; the outer reads see the statement's
            # snapshot, where a skipped row still matches: reported as busy, not lost.
            return self._fetch(
                f"WITH l AS (SELECT {key} FROM {table} WHERE {where}"
                " FOR NO KEY UPDATE SKIP LOCKED),"
                f" u AS (UPDATE {table} SET {set_sql} WHERE {key} IN (SELECT {key} FROM l)"
                f" RETURNING {columns})"
                f" SELECT {columns}, 1 FROM u UNION ALL SELECT {columns}, 0 FROM {table}"
                f" WHERE {where} AND {key} NOT IN (SELECT {key} FROM u)",
                [*where_params, *set_params, *where_params],
            )
        # SQLite: one write transaction (the database's write lock) for the whole batch.
        with self.atomic():
            rows = self._fetch(f"SELECT {columns} FROM {table} WHERE {where}", where_params)
            if rows:
                marks = ", ".join(["%s"] * len(rows))
                self._execute(
                    f"UPDATE {table} SET {set_sql} WHERE {key} IN ({marks})",
                    [*set_params, *(row[0] for row in rows)],
                )
        return [(*row, 1) for row in rows]
