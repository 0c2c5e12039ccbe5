"""The SQLite store: dispatch, renewals and deliveries as one writer at a time sees them.

Only what differs from the portable parts of :class:`~selvedge_django.storage.store.Store`
in the store's parts; the database itself (``BEGIN IMMEDIATE``, the writer turn,
probes before the write lock, WAL, pragmas and checks) is
:class:`~selvedge_django.storage.sqlite.db.SQLiteDatabase`:

* dispatch picks, leases and reads back in one write transaction, after a read
  that finds whether there is anything to lease;
* the status report's reads name their partial index (``INDEXED BY``);
* before SQLite 3.35 there is no ``UPDATE ... RETURNING``: the writes that read
  back what they changed read first instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError

from ... import exceptions as exc
from ...engine.events import Arrivals, Fence
from ...engine.ports import Observation, TaskClaim
from ...models import WorkflowInstance
from .. import sql
from ..attempt_transactions import AttemptTransactions
from ..instances import Instances
from ..operation import operation
from ..releases import Releases
from ..store import Store
from ..waits import Waits
from ..wakeups import TOPIC_RUNNABLE
from .bulk_starts import SQLiteBulkStarts
from .db import SQLiteDatabase

logger = logging.getLogger("selvedge_django.store")

__all__ = [
    "SQLiteAttemptTransactions",
    "SQLiteInstances",
    "SQLiteReleases",
    "SQLiteStore",
    "SQLiteWaits",
]

# -- statements only SQLite runs ----------------------------------------------------------------

# Dispatch, second part, as SQLite must see it: it uses a partial index only when the
# query repeats the index's terms, and Django spells the boolean of sv_inst_rank_idx's
# condition "runnable" up to 6.0 and "runnable" = 1 from 6.1; both terms, so that the
# index serves whichever Django created it.
DISPATCH_READY = (
    "status = 'running' AND lease_owner = '' AND runnable AND runnable = 1"
    " AND ready_ms <= {now}{named}"
)
# Whether dispatch would find anything (a read before the write lock).
DISPATCH_PROBE = (
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM {instance} WHERE {ready})"
    " OR EXISTS (SELECT 1 FROM {instance} WHERE {expired})"
)
# The candidates of a dispatch, expired leases first, then the ready ones by priority
# and age, equals by creation (sql.READY_ORDER).
DISPATCH_PICK = (
    "SELECT instance_id, part FROM (SELECT instance_id, 0 AS part, 0 AS since, 0 AS seq"
    " FROM (SELECT instance_id FROM {instance} WHERE {expired}"
    " ORDER BY lease_expires_ms LIMIT %(limit)s) UNION ALL"
    f" SELECT instance_id, 1, since, seq FROM (SELECT instance_id, {sql.READY_RANK} AS since,"
    f" created_seq AS seq FROM {{instance}} WHERE {{ready}} ORDER BY {sql.READY_ORDER}"
    " LIMIT %(limit)s))"
    " ORDER BY part, since, seq LIMIT %(limit)s"
)
# Lease the picked candidates ({ids}: marks).
DISPATCH_LEASE = sql.LEASE_SET + " WHERE instance_id IN ({ids})"
# Read the leased rows back ({ids}: marks).
DISPATCH_READ_BACK = (
    f"SELECT instance_id, lease_epoch, {sql.HEAD_COLUMNS}, {sql.LEASED_PARKED_VALUE},"
    f" {sql.LEASED_HISTORY_EMPTY},"
    " ready_ms, lease_expires_ms FROM {instance}"
    " WHERE lease_owner = %(owner)s AND instance_id IN ({ids})"
)


class SQLiteInstances(Instances):
    """Dispatch as one writer at a time sees it: probe, then pick, lease and read back."""

    db: SQLiteDatabase

    def _lease_rows(self, named: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # Pick, lease, read back, in one write transaction. (Its UPDATE ... RETURNING
        # reports no row count until the rows are read, which statement wrappers such as
        # the fault injector's need.) A read first: a write transaction locks the whole
        # database.
        expired = sql.compose(sql.DISPATCH_EXPIRED, named=named)
        ready = sql.compose(DISPATCH_READY, named=named)
        if not self.db._fetch(sql.compose(DISPATCH_PROBE, expired=expired, ready=ready), params):
            return []
        with self.db.atomic():
            picked = self.db._fetch(
                sql.compose(DISPATCH_PICK, expired=expired, ready=ready), params
            )
            ids = [row[0] for row in picked]
            if not ids:
                return []
            marks, leased = sql.marks(len(ids), "leased"), sql.numbered("leased", ids)
            lease = {key: params[key] for key in ("owner", "ttl_ms", "runnable")}
            self.db._execute(sql.compose(DISPATCH_LEASE, ids=marks), {**lease, **leased})
            taken_over = {row[0] for row in picked if row[1] == 0}
            read_back = sql.compose(DISPATCH_READ_BACK, ids=marks)
            rows = self.db._fetch(read_back, {"owner": params["owner"], **leased})
            return [(*row, row[0] in taken_over) for row in rows]


class SQLiteReleases(Releases):
    """The release of a lease without ``RETURNING`` (before SQLite 3.35)."""

    db: SQLiteDatabase

    @operation
    def release_lease(
        self,
        fence: Fence,
        runnable: bool = False,
        parked: tuple[int, str] | None = None,
        sticky: float | None = None,
    ) -> None:
        if self.db._returning or self.db.has_deferred(fence):
            super().release_lease(fence, runnable, parked, sticky)
            return
        updated = (
            WorkflowInstance.objects.using(self.db.alias)
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
                **(self.db.wake_fields() if runnable else {}),
                **({} if parked is None else {"parked_seq": parked[0], "parked_key": parked[1]}),
                sticky_owner=fence.owner if sticky is not None else "",
                sticky_until_ms=self.db.now_expr(sticky or 0.0),
            )
        )
        if updated:
            # An arrival during the execution may have left it runnable: dispatch again.
            self.db.after_commit(TOPIC_RUNNABLE)


class SQLiteWaits(Waits):
    """Deliveries without ``RETURNING`` (before SQLite 3.35): read first, then write."""

    db: SQLiteDatabase

    def _deliver(self, iid: str, seq: int, observation: Observation) -> Arrivals:
        if self.db._returning or not (observation.deliver_all or observation.deliver):
            return super()._deliver(iid, seq, observation)
        return self._deliver_read_first(iid, seq, observation)


class SQLiteAttemptTransactions(AttemptTransactions):
    """A transactional attempt's transaction, holding the write lock from a live claim.

    The transaction holds the database's write lock from BEGIN IMMEDIATE to its end, so
    nobody can renew this claim meanwhile, and nobody can take it over either. The claim
    must be live when the lock is taken (else :class:`LeaseLost`); then the attempt
    extends its own claim (its deadline permitting) before it records the outcome (the
    callable yielded), and, when the body fails, after rolling the body back to a
    savepoint, so that the failure is recorded as this attempt's own, not as a lapse.
    """

    @operation
    @contextlib.contextmanager
    def transactional_attempt(
        self, claim: TaskClaim, ttl: float, timeout: float | None
    ) -> Iterator[Callable[[], object]]:
        failure: BaseException | None = None
        with self.db.atomic():
            if not self.tasks.claim_live(claim):
                raise exc.LeaseLost(f"the claim on {claim.instance_id}/{claim.key} lapsed")
            try:
                with self.db.atomic():  # a savepoint: the body's writes
                    yield functools.partial(self.tasks.extend_claim_under_lock, claim, ttl)
            except BaseException as error:
                failure = error
                try:
                    self.tasks.extend_claim_under_lock(claim, ttl)
                except DatabaseError:
                    logger.debug(
                        "could not extend the claim of %s/%s", claim.instance_id, claim.key
                    )
        if failure is not None:
            raise failure


class SQLiteStore(Store):
    """The store on SQLite: its database and the parts that differ there."""

    database = SQLiteDatabase
    single_writer = SQLiteDatabase.single_writer
    instances_class = SQLiteInstances
    releases_class = SQLiteReleases
    waits_class = SQLiteWaits
    attempt_transactions_class = SQLiteAttemptTransactions
    bulk_starts_class = SQLiteBulkStarts
