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

from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.events import Fence
from ..engine.ports import TaskClaim
from ..models import ActivityTaskStatus, WorkflowStatus
from . import sql
from .db import Database
from .operation import operation

__all__ = ["RENEWAL_BATCH", "Renewal", "Renewals"]

# Rows per renewal statement (two or three parameters each).
RENEWAL_BATCH = 200

# What a renewal reports per lease or claim: True renewed, False lost (taken over,
# released, closed, cancelled or expired), None busy (PostgreSQL: the row is locked by
# another transaction and was skipped; try again soon).
Renewal = bool | None


class Renewals:
    """Batch renewals of leases and claims (``store.renewals``).

    The renewer's store sets ``urgent_writes`` on its database, so on SQLite these
    writes take the writer's turn before every other writer of the process.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> dict[Fence, Renewal]:
        """Extend every unexpired matching lease of ``fences`` by ``ttl`` on the database clock.

        Returns, per fence, True (renewed), False (lost) or None (the instance row is
        locked by another transaction, PostgreSQL only: skipped, not waited for).
        """
        results: dict[Fence, Renewal] = {}
        for start in range(0, len(fences), RENEWAL_BATCH):
            chunk = list(fences[start : start + RENEWAL_BATCH])
            match = sql.any_of(sql.LEASE_MATCH, len(chunk))
            params: dict[str, Any] = {
                "running": str(WorkflowStatus.RUNNING),
                "ttl_ms": round(ttl * 1000),
            }
            for i, fence in enumerate(chunk):
                params[f"instance_{i}"] = fence.instance_id
                params[f"epoch_{i}"] = fence.epoch
                params[f"owner_{i}"] = fence.owner
            where = sql.compose(sql.LIVE_LEASES, match=match)
            rows = self.db._renew(
                "{instance}", "instance_id, lease_epoch", where, sql.RENEW_LEASE_SET, params
            )
            state = {(row[0], int(row[1])): bool(row[2]) for row in rows}
            for fence in chunk:
                renewed = state.get((fence.instance_id, fence.epoch))
                results[fence] = False if renewed is None else (True if renewed else None)
        return results

    @operation
    def renew_claims(
        self,
        claims: Sequence[tuple[TaskClaim, float]],
        details: Mapping[TaskClaim, str] | None = None,
    ) -> dict[TaskClaim, Renewal]:
        """Extend every live claim of ``claims`` by its TTL, never past its attempt's deadline.

        ``claims`` pairs each claim with its TTL in seconds; ``details`` maps the
        claims whose attempt gave new heartbeat details to their JSON text, stored by
        the same statement (only those claims are listed, two values each). Returns,
        per claim, True (renewed), False (lost: expired, taken over, finished or
        cancelled) or None (the task row is locked by another transaction, PostgreSQL
        only).
        """
        results: dict[TaskClaim, Renewal] = {}
        for start in range(0, len(claims), RENEWAL_BATCH):
            chunk = list(claims[start : start + RENEWAL_BATCH])
            match = sql.any_of(sql.CLAIM_MATCH, len(chunk))
            params: dict[str, Any] = {"running": str(ActivityTaskStatus.RUNNING)}
            for i, (claim, ttl) in enumerate(chunk):
                params[f"task_{i}"] = claim.task_id
                params[f"epoch_{i}"] = claim.epoch
                params[f"owner_{i}"] = claim.owner
                params[f"ttl_ms_{i}"] = round(ttl * 1000)
            where = sql.compose(sql.LIVE_CLAIMS, match=match)
            set_sql = sql.renew_claim_set(len(chunk))
            new = details or {}
            given = [(claim.task_id, new[claim]) for claim, _ in chunk if claim in new]
            if given:
                set_sql += sql.renew_details_set(len(given))
                for j, (task_id, value) in enumerate(given):
                    params.update({f"detailed_{j}": task_id, f"details_{j}": value})
            rows = self.db._renew("{task}", "id, claim_epoch", where, set_sql, params)
            state = {(int(row[0]), int(row[1])): bool(row[2]) for row in rows}
            for claim, _ in chunk:
                renewed = state.get((claim.task_id, claim.epoch))
                results[claim] = False if renewed is None else (True if renewed else None)
        return results
