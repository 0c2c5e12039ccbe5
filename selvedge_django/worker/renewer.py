"""Renews held leases and live activity claims before they expire.

Each round renews every lease that is due in one statement and every claim that
is due in another (:meth:`~selvedge_django.storage.renewals.Renewals.renew_leases`,
``renew_claims``). A row another transaction holds (a client's signal or cancel
still open in ``transaction.atomic()``) is skipped, not waited for, and tried
again at the next round (PostgreSQL), so one held row never delays the renewal
of any other lease or claim.

Renewals run on a store of their own (``WorkerRuntime.renewal_store``): on
``SELVEDGE["RENEWAL_DATABASE"]`` when it is set, a connection past the pooler that
the worker's own transactions may fill (pgbouncer in transaction mode), and on
SQLite first in line for the process's writer turn, so that no write of the
worker's own makes them wait longer than the transaction that holds the lock; a
round keeps the turn from its first statement to its last, so it waits once.

A lease is due a renewal interval after the statement that took it or last renewed
it began, which on SQLite is after that statement's wait for the writer's turn
(``InstanceHead.leased_at``): a dispatch that waited long behind other writers
still holds its lease for the whole belief from when it took it. It is due sooner
when the interval would come later than two ticks before the belief ends (accepted
settings may make it that long), so that a holder whose renewals succeed goes on
trusting a lease the database still gives it.

A lease renewal moves the holder's belief forward from the moment the renewal
started; a renewal that matched no row drops the belief, so the execution's next
commit raises LeaseLost. A claim with a heartbeat timeout is extended only after
the activity reported new progress; a claim whose renewal matched no row cancels
its attempt (``heartbeat()`` then raises ActivityCancelled). The latest details an
attempt gave ``heartbeat(details)`` since its last renewal ride on that renewal's
statement (no statement of their own), so the task's next attempt starts from them.

A renewal statement that fails (a database error) or skips a held row proves
nothing about the lease or the claim: it is tried again at the next tick, and the
lease belief stays as it was. An attempt is cancelled for such failures only once
its claim's expiry has passed by the local monotonic estimate (the start of the
last successful claim or renewal statement plus the claim TTL).

An attempt that keeps running after it had to stop (past its start-to-close
deadline, its claim lost, a heartbeat missed) for longer than
:data:`~selvedge_django.worker.attempts.HUNG_AFTER` is *hung*: it is logged once and
counted by ``Worker.hung_attempts()``. Its claim is no longer renewed, and when
it runs inline the execution's lease is given up too, so that another execution
can resume the instance with the outcome of the attempt that replaced it.

The renewer runs until the supervisor stops it, after everything in flight has
finished or been released at shutdown.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..storage.wakeups import Bus
from .base import Loop

if TYPE_CHECKING:
    from ..engine.activity import AttemptState
    from ..engine.events import Fence
    from ..engine.ports import ClaimedTask, TaskClaim
    from .runtime import WorkerRuntime

__all__ = ["Renewer"]

logger = logging.getLogger("selvedge_django.worker")


class Renewer(Loop):
    """Renew what this worker holds; returns 0 so it keeps its own cadence."""

    name = "renewer"

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        lease = runtime.settings.lease
        super().__init__(bus, lease.renewer_tick, lease.renewer_tick)
        self.runtime = runtime
        self._renewed: dict[Fence, float] = {}
        self._busy_since: dict[Fence, float] = {}
        self._busy_reported: set[Fence] = set()
        self._claims: dict[TaskClaim, tuple[float, int]] = {}
        self._progress: dict[TaskClaim, tuple[float, int]] = {}
        self._reported: set[TaskClaim] = set()
        self._lost: set[TaskClaim] = set()  # renewals that matched no row
        self._stored_details: dict[TaskClaim, str] = {}  # the details each claim last stored

    def run_once(self) -> int:
        now = time.monotonic()
        self._report_hung(now)
        if not (self._due_leases(now) or self._due_claims(now)):
            return 0
        # On SQLite, one wait for the writer's turn for both statements: between them
        # a worker busy with its own writes would take the turn, and the claims would
        # wait a second time for its transaction. What is due is looked at again once
        # the turn is taken: more may have come due during the wait.
        with self.runtime.renewal_store.db.writer_turn():
            now = time.monotonic()
            leases = self._due_leases(now)
            claims = self._due_claims(now)
            if leases:
                self._renew_leases(leases, now)
            if claims:
                self._renew_claims(claims, now)
        return 0

    def _report_hung(self, now: float) -> None:
        """Log each hung attempt once; give up the lease of an execution stuck in one."""
        runtime = self.runtime
        hung = runtime.attempts.hung_attempts(now)
        for attempt in hung:
            if attempt.claim in self._reported:
                continue
            self._reported.add(attempt.claim)
            given_up = attempt.fence is not None and runtime.give_up(attempt.fence)
            logger.warning(
                "activity %s/%s (%s) attempt %d still runs %.1f s after it had to stop (%s);"
                " its thread stays taken until it returns%s",
                attempt.instance_id,
                attempt.key,
                attempt.activity_name,
                attempt.attempt,
                attempt.overdue,
                attempt.reason,
                "; the lease of its execution is given up, so that another execution can"
                " resume the instance"
                if given_up
                else "",
                extra={"instance_id": attempt.instance_id, "worker_id": runtime.worker_id},
            )
        live = {attempt.claim for attempt in hung}
        self._reported &= live

    def _due_leases(self, now: float) -> list[Fence]:
        """The held leases whose renewal is due; forget the ones no longer held."""
        # The interval, or sooner when the holder's belief would lapse first.
        every = self.runtime.settings.lease.renew_every
        fences = self.runtime.held_fences()
        due = []
        for fence, proven in fences.items():
            # A lease first seen here is due a renewal interval after it was taken,
            # not after this loop first saw it (a round may have waited since).
            last = self._renewed.setdefault(fence, proven)
            if now - last >= every:
                due.append(fence)
        for fence in list(self._renewed):
            if fence not in fences:
                del self._renewed[fence]
                self._busy_since.pop(fence, None)
                self._busy_reported.discard(fence)
        return due

    def _renew_leases(self, due: list[Fence], now: float) -> None:
        runtime = self.runtime
        interval = runtime.settings.lease.renew_interval
        results = runtime.renew_leases(due)
        if results is None:
            return  # the statement failed (logged): every one again at the next tick
        for fence, ok in results.items():
            if ok is not None:
                self._renewed[fence] = now
                self._busy_since.pop(fence, None)
                self._busy_reported.discard(fence)
                continue
            # The row is held by another transaction: again at the next tick. Say so
            # once when it stays held for a renewal interval.
            since = self._busy_since.setdefault(fence, now)
            if now - since >= interval and fence not in self._busy_reported:
                self._busy_reported.add(fence)
                logger.warning(
                    "the lease on %s could not be renewed for %.1f s: another transaction"
                    " holds its row (a signal or cancel inside a long transaction?); the"
                    " lease lapses if that lasts longer than LEASE['TTL']",
                    fence.instance_id,
                    now - since,
                    extra={"instance_id": fence.instance_id, "worker_id": runtime.worker_id},
                )

    def _due_claims(self, now: float) -> list[tuple[ClaimedTask, AttemptState, int]]:
        """The live claims whose renewal is due, with their attempt and its progress.

        Cancels the attempts whose heartbeat timed out; forgets finished attempts.
        """
        runtime = self.runtime
        interval = runtime.settings.lease.renew_interval
        live = set()
        due: list[tuple[ClaimedTask, AttemptState, int]] = []
        for task, state in runtime.attempts.active_attempts():
            claim = task.claim
            live.add(claim)
            # Both clocks start with the attempt, not when this loop first sees it.
            last, progress = self._claims.setdefault(claim, (state.started, 0))
            seen_at, seen = self._progress.setdefault(claim, (state.started, 0))
            if state.progress != seen:
                self._progress[claim] = (now, state.progress)
            elif task.heartbeat_timeout is not None and now - seen_at > task.heartbeat_timeout:
                state.cancel("heartbeat timeout")
            deadline = state.deadline_monotonic
            if claim in self._lost or (deadline is not None and now >= deadline):
                continue  # no renewal can extend it any more
            every = min(interval, task.claim_ttl / 3)
            if now - last < every:
                continue
            if task.heartbeat_timeout is not None and state.progress == progress:
                continue  # no new heartbeat: let the claim lapse
            due.append((task, state, state.progress))
        for claim in list(self._claims):
            if claim not in live:
                del self._claims[claim]
                self._progress.pop(claim, None)
                self._stored_details.pop(claim, None)
        self._lost &= live
        return due

    def _renew_claims(self, due: list[tuple[ClaimedTask, AttemptState, int]], now: float) -> None:
        runtime = self.runtime
        details = {
            task.claim: state.details
            for task, state, _ in due
            if state.details is not None and state.details != self._stored_details.get(task.claim)
        }
        try:
            results = runtime.renewal_store.renewals.renew_claims(
                [(task.claim, task.claim_ttl) for task, _, _ in due], details
            )
        except Exception:
            logger.warning("claim renewal of %d claims failed", len(due), exc_info=True)
            runtime.drop_broken_connection(runtime.renewal_store.alias)
            results = {}
        for task, state, progress in due:
            claim = task.claim
            ok = results.get(claim)
            if ok:
                self._claims[claim] = (now, progress)
                if claim in details:
                    self._stored_details[claim] = details[claim]
                runtime.attempts.claim_renewed(claim, now, task.claim_ttl)
            elif ok is False:
                self._lost.add(claim)
                state.cancel("claim lost")
            elif time.monotonic() >= runtime.attempts.claim_belief(claim):
                # Failed or held by another transaction: again at the next tick, unless
                # the claim has expired by now, as far as this worker can tell.
                state.cancel("claim lost")

    def next_delay(self, idle_delay: float) -> float:
        """Tick often enough to renew the shortest live claim several times per TTL."""
        ttls = [task.claim_ttl for task, _ in self.runtime.attempts.active_attempts()]
        return min([idle_delay, *(ttl / 4 for ttl in ttls)])
