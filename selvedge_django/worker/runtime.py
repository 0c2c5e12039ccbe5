"""The Django-side runtime an execution runs in: store, codec, clock, leases, attempts.

One :class:`WorkerRuntime` belongs to one :class:`~selvedge_django.worker.Worker`
(or to the client API, which never runs workflow code). It keeps each held
lease's *belief*: the monotonic deadline until which the holder may trust its
lease without asking the database (renewal start + TTL - MARGIN - MAX_SKEW).
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
import weakref
from typing import Any

from django.db import connections

from .. import exceptions as exc
from .. import hooks as hooks_module
from .. import signals
from ..conf import SelvedgeSettings
from ..engine.codec import error_to_envelope
from ..engine.context import WorkflowContext
from ..engine.events import Fence
from ..engine.execution import Execution
from ..engine.ports import (
    ClaimedTask,
    CloseRequest,
    ExecutionOutcome,
    ExecutionSnapshot,
    HistoryLimits,
)
from ..registry import get_workflow, registered_activity_names
from ..storage import InstanceHead, client_codec, store_for
from ..storage.errors import backoff_delay, describe, is_data_error
from . import handoff
from .attempts import HUNG_AFTER, Attempts, HungAttempt
from .cache import WorkflowCache
from .undecodable import Undecodable

__all__ = ["HUNG_AFTER", "HungAttempt", "WorkerRuntime", "client_codec"]  # client_codec: storage's

logger = logging.getLogger("selvedge_django.worker")


class WorkerRuntime:
    """Everything executions and attempts of one worker share; the attempts are a member."""

    def __init__(self, settings: SelvedgeSettings) -> None:
        self.settings = settings
        self.codec = client_codec(settings)
        self.store = store_for(settings.database, self.codec, settings)
        self.store.options.lease_ttl = settings.lease.ttl
        self.store.options.activity_queues = settings.activity_queues
        self.store.options.activity_names = registered_activity_names
        self.store.db.on_closed = handoff.finished
        # The renewer's own store: on RENEWAL_DATABASE when set (a direct connection
        # past a pooler), and first in line for SQLite's write lock.
        self.renewal_store = store_for(
            settings.renewal_database or settings.database, self.codec, settings
        )
        self.renewal_store.options.lease_ttl = settings.lease.ttl
        self.renewal_store.db.urgent_writes = True
        self.worker_id = settings.worker_id
        self.hooks = settings.hooks
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._beliefs: dict[Fence, float] = {}
        # Instances whose stored values this worker cannot decode (no key for them).
        self.undecodable = Undecodable(self.worker_id)
        # The activity attempts of this worker, inline and in the background.
        self.attempts = Attempts(
            settings=settings,
            store=self.store,
            codec=self.codec,
            stopping=self.stopping,
            fire=self.fire,
            drop_broken_connection=self.drop_broken_connection,
        )
        # Monotonic times at which instances this worker held back after a storage error
        # become dispatchable again (the dispatcher polls then).
        self._deferred: list[float] = []
        # Set by the Worker when SELVEDGE["WORKFLOW_CACHE"] keeps suspended executions:
        # the executions it let go while parked (nothing left to write for them), and
        # when (monotonic) each one it continued last went on.
        self.cache: WorkflowCache | None = None
        self._let_go: weakref.WeakSet[Execution] = weakref.WeakSet()
        self._resumed_at: weakref.WeakKeyDictionary[Execution, float] = weakref.WeakKeyDictionary()

    # -- engine Runtime protocol --------------------------------------------------------

    @property
    def history_limits(self) -> HistoryLimits:
        return HistoryLimits(self.settings.max_history_events, self.settings.max_history_bytes)

    def clock(self) -> Any:
        return self.settings.clock()

    def lease_valid(self, fence: Fence) -> bool:
        with self._lock:
            deadline = self._beliefs.get(fence)
        return deadline is not None and time.monotonic() < deadline

    def park(self, execution: Execution, why: str, sleep: float | None = None) -> Fence | None:
        """Keep a suspending execution in the workflow cache until its next lease here.

        Called by :meth:`~selvedge_django.engine.execution.Execution.wait_here` on the
        execution's thread with the lease held. Returns the new fence to go on under, or
        None: either not kept (the lease is still held and the suspension goes on as
        without a cache) or let go after the release (nothing is left to write:
        :meth:`_execute` returns at once). ``sleep``: see :meth:`WorkflowCache.admit`.
        """
        cache = self.cache
        fence = execution.fence
        if cache is None or fence is None or self.stopping.is_set():
            return None
        definition = get_workflow(execution.workflow_name)
        if definition is None:
            return None
        entry = cache.admit(execution, definition.fn, sleep)
        if entry is None:
            return None
        if not cache.detach(entry):
            return None
        if not execution.released:
            try:
                self.store.release_lease(
                    fence,
                    parked=(execution.seq, execution.last_key),
                    sticky=self.settings.workflow_cache.sticky_window,
                )
            except Exception:
                # Suspended as without a cache: the release is tried again, and a
                # failure there is handled as a storage error.
                cache.discard(entry)
                return None
        execution.released = True
        # An inline result no write took (the lease went with a reservation, or a pause
        # fenced the execution out) is recorded now, as when an execution ends: a kept
        # execution may wait far longer than its attempt's claim lasts.
        self.attempts.outcomes.flush_inline_results(fence)
        self.drop(fence)
        handoff.finished(fence.instance_id)
        self.fire(
            "on_workflow_suspended",
            instance_id=fence.instance_id,
            workflow_name=execution.workflow_name,
        )
        resumed = cache.wait(entry)
        with self._lock:
            if resumed is None:
                self._let_go.add(execution)
            else:
                self._resumed_at[execution] = time.monotonic()
        if resumed is not None:
            # Continued, not loaded: the history it holds is the one a replay would load.
            self._warn_history(resumed.instance_id, len(execution.history))
        return resumed

    def _warn_history(self, instance_id: str, events: int) -> None:
        """Log that an execution goes on with a history over the warning threshold."""
        threshold = self.settings.history_warning_threshold
        if events > threshold:
            logger.warning(
                "instance %s has %d history events (threshold %d)",
                instance_id,
                events,
                threshold,
                extra={"instance_id": instance_id},
            )

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        return self.attempts.can_run_inline(activity_name, queue)

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None:
        return self.attempts.run_attempt(task)

    def tasks_reserved(self) -> None:
        """New queued tasks: the store already wakes local activity workers on commit."""

    def next_deferred_in(self) -> float | None:
        """Seconds until an instance this worker held back may be dispatched (None: none)."""
        now = time.monotonic()
        with self._lock:
            while self._deferred and self._deferred[0] <= now - 1.0:
                heapq.heappop(self._deferred)  # dispatched by now, here or elsewhere
            if not self._deferred:
                return None
            return max(0.0, self._deferred[0] - now)

    def fire(self, hook: str, **fields: Any) -> None:
        hooks_module.fire(self.hooks, hook, worker_id=self.worker_id, **fields)
        signals.send(hook, **fields)

    # -- leases -------------------------------------------------------------------------

    def hold(self, fence: Fence, renewal_started: float) -> None:
        with self._lock:
            self._beliefs[fence] = renewal_started + self.settings.lease.belief

    def drop(self, fence: Fence) -> None:
        with self._lock:
            self._beliefs.pop(fence, None)

    def held_fences(self) -> dict[Fence, float]:
        """Each lease this worker holds, with when (monotonic) it was last proven: the
        start of the statement that took or last renewed it."""
        belief = self.settings.lease.belief
        with self._lock:
            return {fence: deadline - belief for fence, deadline in self._beliefs.items()}

    def renew_leases(self, fences: list[Fence]) -> dict[Fence, bool | None] | None:
        """Renew leases in one statement and move their beliefs forward.

        Per fence: True when renewed, False when the lease is lost (the renewal
        matched no row: the belief is dropped), None when another transaction holds
        the instance row (skipped): the belief is left as it was (it still bounds what
        the holder may trust) and the caller tries again soon. Returns None when the
        statement failed, with the same meaning for every fence.
        """
        started = time.monotonic()
        try:
            results = self.renewal_store.renewals.renew_leases(fences, self.settings.lease.ttl)
        except Exception:
            logger.warning("renewal of %d leases failed", len(fences), exc_info=True)
            self.drop_broken_connection(self.renewal_store.alias)
            return None
        belief = self.settings.lease.belief
        with self._lock:
            for fence, ok in results.items():
                if ok is not None and fence in self._beliefs:
                    self._beliefs[fence] = started + belief if ok else 0.0
        return results

    def give_up(self, fence: Fence) -> bool:
        """Stop holding a lease without a write: it is no longer renewed and lapses.

        The execution's next write raises LeaseLost (no belief is left), and once the
        lease has expired any dispatcher may lease the instance again. For an
        execution stuck in a hung inline attempt. Returns whether it was held.
        """
        with self._lock:
            return self._beliefs.pop(fence, None) is not None

    # -- connections --------------------------------------------------------------------

    def drop_broken_connection(self, alias: str | None = None) -> None:
        """After a database error, close this thread's connection (of ``alias``, by
        default the engine's) if it no longer works."""
        conn = connections[alias or self.store.alias]
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()

    # -- executions ---------------------------------------------------------------------

    def execute(
        self,
        fence: Fence,
        renewal_started: float,
        snapshot: ExecutionSnapshot | None = None,
        head: InstanceHead | None = None,
    ) -> ExecutionOutcome | None:
        """Run one execution of a leased instance to suspension, close or abandonment.

        ``snapshot`` is given for an instance this process just started (nothing to
        read); otherwise the snapshot is loaded under the lease, reading only the
        history when the lease brought the instance row (``head``). A lease already
        held (handed over before the execution got a thread) keeps its belief.
        """
        with self._lock:
            if fence not in self._beliefs:
                self._beliefs[fence] = renewal_started + self.settings.lease.belief
        try:
            return self._execute(fence, snapshot, head)
        finally:
            self.attempts.outcomes.flush_inline_results(fence)
            self.drop(fence)

    def _execute(
        self, fence: Fence, snapshot: ExecutionSnapshot | None, head: InstanceHead | None
    ) -> ExecutionOutcome | None:
        store = self.store
        if snapshot is None:
            try:
                snapshot = store.instances.load_snapshot(
                    fence.instance_id, head, max_events=self.settings.max_history_events
                )
            except exc.WorkflowNotFound:
                return None
            except Exception as error:
                failure = self._after_storage_error(fence, error)
                if failure is None:
                    return ExecutionOutcome("abandoned", error=error)
                name = head.workflow_name if head is not None else ""
                self.fire(
                    "on_workflow_failed",
                    error=failure,
                    duration=0.0,
                    instance_id=fence.instance_id,
                    workflow_name=name,
                )
                return ExecutionOutcome("failed", error=failure)
        definition = get_workflow(snapshot.workflow_name)
        if definition is None or snapshot.status != "running":
            # Another worker that registers the workflow will take it.
            store.release_lease(fence, runnable=definition is None)
            return None
        if len(snapshot.history) > self.settings.max_history_events:
            return self._fail_oversized(fence, snapshot)
        self._warn_history(fence.instance_id, len(snapshot.history))
        base = dict(instance_id=fence.instance_id, workflow_name=snapshot.workflow_name)
        if snapshot.history:
            self.fire("on_workflow_replayed", **base)
        execution = Execution(self, snapshot, fence)
        started = time.monotonic()
        outcome = execution.run(definition.fn, WorkflowContext(execution, execution.root_scope))
        with self._lock:
            let_go = execution in self._let_go
            started = max(started, self._resumed_at.get(execution, started))
        if let_go:
            # Parked in the workflow cache, which let it go: its lease was released when
            # it parked, and a replay (or nothing) follows.
            return outcome
        # The lease it ends under: a later one when the cache continued it.
        current = execution.fence
        assert current is not None
        try:
            self._finish(execution, outcome)
        except exc.Fenced:
            logger.info("execution of %s was fenced out at close", fence.instance_id)
            outcome.kind = "abandoned"  # nothing was closed: no close hooks
        except exc.LeaseLost as error:
            # An inline result's claim lapsed before the close could record it: the
            # close rolled back; replay from what is recorded (the activity runs again).
            logger.warning("execution of %s abandoned at close: %s", fence.instance_id, error)
            self.release_quietly(fence, runnable=True)
            outcome.kind, outcome.error = "abandoned", error
        except Exception as error:
            # The close or the release failed (or committed, and the connection was lost
            # before it said so: then the lease is no longer held, and nothing is done).
            failure = self._after_storage_error(current, error)
            outcome.kind = "abandoned" if failure is None else "failed"
            outcome.error = error if failure is None else failure
        finally:
            if current != fence:
                self.drop(current)
        if outcome.kind in ("completed", "failed", "cancelled"):
            self.fire(
                f"on_workflow_{outcome.kind}",
                error=outcome.error,
                duration=time.monotonic() - started,
                **base,
            )
        elif outcome.kind == "suspended":
            self.fire("on_workflow_suspended", duration=time.monotonic() - started, **base)
        return outcome

    def _fail_oversized(self, fence: Fence, snapshot: ExecutionSnapshot) -> ExecutionOutcome:
        """Fail an instance whose history is already over MAX_HISTORY_EVENTS, without replay.

        Only ``MAX_HISTORY_EVENTS + 1`` rows were loaded, so the workflow code cannot
        run; the close cancels whatever tasks, timers and children it may still have.
        """
        limit = self.settings.max_history_events
        error = exc.HistoryLimitExceeded(
            fence.instance_id,
            "MAX_HISTORY_EVENTS",
            limit,
            f"the history of workflow instance {fence.instance_id!r} holds more than "
            f"{limit} events (MAX_HISTORY_EVENTS); the instance is failed without replaying",
        )
        request = CloseRequest(
            "failed",
            None,
            json.dumps(error_to_envelope(error, codec=self.codec, with_traceback=False)),
            unfinished=True,
            children=True,
            parent=(snapshot.parent_instance_id, snapshot.parent_key),
        )
        outcome = ExecutionOutcome("failed", error=error)
        if not self.lease_valid(fence):
            self.release_quietly(fence, runnable=True)
            outcome.kind = "abandoned"
            return outcome
        try:
            outcome.kind = self.store.close(fence, request)
        except exc.Fenced:
            outcome.kind = "abandoned"
            return outcome
        logger.warning(
            "workflow %s failed: history over MAX_HISTORY_EVENTS (%d)",
            fence.instance_id,
            limit,
            extra={"instance_id": fence.instance_id},
        )
        self.fire(
            "on_workflow_failed",
            error=error,
            duration=0.0,
            instance_id=fence.instance_id,
            workflow_name=snapshot.workflow_name,
        )
        return outcome

    def _finish(self, execution: Execution, outcome: ExecutionOutcome) -> None:
        fence = execution.fence
        assert fence is not None
        if not isinstance(outcome.error, exc.PayloadDecodeError):
            self.undecodable.decoded(fence.instance_id)  # it ran here: the key is here now
        if outcome.kind == "suspended":
            if not execution.released:
                self.store.release_lease(fence, parked=(execution.seq, execution.last_key))
            return
        if execution.released:
            # Only code that swallowed the suspension of a background execute() gets here:
            # the lease went with the reservation, so nothing can be closed now.
            logger.warning(
                "execution of %s ended (%s) after its lease was released with an activity's"
                " reservation: workflow code swallowed the suspension; the instance runs"
                " again when the activity completes",
                fence.instance_id,
                outcome.kind,
                extra={"instance_id": fence.instance_id},
            )
            outcome.kind = "abandoned"  # nothing was closed: no close hooks
            return
        if outcome.kind == "abandoned":
            error = outcome.error
            if isinstance(error, exc.Fenced):
                return
            if isinstance(error, exc.PayloadDecodeError):
                self._leave_undecodable(execution, error)
                return
            if error is None or isinstance(error, exc.LeaseLost | exc.HistoryKeyConflict):
                logger.warning("execution of %s abandoned: %r", fence.instance_id, error)
                self.release_quietly(fence, runnable=True)
                return
            # A store operation failed: replaying at once could fail the same way forever.
            failure = self._after_storage_error(fence, error)
            if failure is not None:
                outcome.kind, outcome.error = "failed", failure
            return
        if outcome.kind == "continued":
            self._continue_as_new(fence, outcome)
            return
        request = execution.close_request(outcome)
        if not self.lease_valid(fence):
            logger.warning("lease on %s lost before close; not closing", fence.instance_id)
            self.release_quietly(fence, runnable=True)
            outcome.kind = "abandoned"  # nothing was closed: no close hooks
            return
        status = self.store.close(fence, request)
        outcome.kind = status
        if status == "failed":
            logger.info(
                "workflow %s failed: %s",
                fence.instance_id,
                outcome.error,
                extra={"instance_id": fence.instance_id},
            )

    def _leave_undecodable(self, execution: Execution, error: exc.PayloadDecodeError) -> None:
        """Leave an instance this worker cannot decode, unchanged, for one that can.

        Nothing was written (the decode failure stopped the execution before any
        write); the lease is released with the instance runnable, and this worker
        passes it over for a while (:mod:`.undecodable`).
        """
        fence = execution.fence
        assert fence is not None
        self.undecodable.met(fence.instance_id, error)
        self.release_quietly(fence, runnable=True)
        self.fire(
            "on_payload_undecodable",
            instance_id=fence.instance_id,
            workflow_name=execution.snapshot.workflow_name,
            error=error,
        )

    def _continue_as_new(self, fence: Fence, outcome: ExecutionOutcome) -> None:
        """Commit a continue-as-new: the generation ends, the next is runnable."""
        if not self.lease_valid(fence):
            logger.warning("lease on %s lost before continue-as-new", fence.instance_id)
            self.release_quietly(fence, runnable=True)
            outcome.kind = "abandoned"
            return
        generation = self.store.recovery.continue_as_new(fence, outcome.output)
        logger.info(
            "workflow %s continued as new: generation %d",
            fence.instance_id,
            generation,
            extra={"instance_id": fence.instance_id},
        )

    def _after_storage_error(
        self,
        fence: Fence,
        error: BaseException,
    ) -> exc.ExecutionStorageError | None:
        """Fail or hold back an instance whose execution ended on a storage error.

        A data error fails the instance at once, and so does the error that makes
        ``MAX_EXECUTION_ERRORS`` in a row, with :class:`ExecutionStorageError`;
        any other releases the lease with the instance held back
        (:func:`~selvedge_django.storage_errors.backoff_delay`). When even that
        cannot be written, the lease is left to lapse: the instance is taken again
        only after ``LEASE["TTL"]``, never at once. Returns the failure when this
        closed the instance (the caller fires the hook), else None.
        """
        settings = self.settings
        iid = fence.instance_id
        message = describe(error)
        # Most often the connection died while the thread was idle (a restart, a
        # terminated session): count and hold back on a new one.
        self.drop_broken_connection()
        try:
            before = self.store.instances.execution_errors(fence)
        except Exception:
            logger.warning(
                "execution of %s ended on a storage error (%s), and its error count could not"
                " be read; the lease is left to lapse",
                iid,
                message,
                exc_info=True,
                extra={"instance_id": iid},
            )
            self.drop_broken_connection()
            return None
        if before is None:
            # The lease is gone (or the write that failed was a close that committed).
            return None
        errors = before + 1
        data = is_data_error(error)
        limit = settings.max_execution_errors
        if data or (limit is not None and errors >= limit):
            failure = exc.ExecutionStorageError(
                iid,
                errors,
                data,
                f"the database refused the writes of workflow instance {iid!r}"
                + (
                    " (a value it cannot store)"
                    if data
                    else f" {errors} times in a row (MAX_EXECUTION_ERRORS)"
                )
                + f"; the last error: {message}",
            )
            if self._close_failed(fence, failure, {"storage_errors": errors}):
                return failure
        delay = backoff_delay(settings, errors)
        try:
            held = self.store.instances.defer_execution(fence, errors, delay, message)
        except Exception:
            logger.warning(
                "could not hold back %s after a storage error; the lease is left to lapse",
                iid,
                exc_info=True,
                extra={"instance_id": iid},
            )
            self.drop_broken_connection()
            return None
        if held:
            with self._lock:
                heapq.heappush(self._deferred, time.monotonic() + delay)
            logger.warning(
                "execution of %s ended on a storage error (%d in a row); it runs again in"
                " %.1f s: %s",
                iid,
                errors,
                delay,
                message,
                extra={"instance_id": iid},
            )
        return None

    def _close_failed(
        self,
        fence: Fence,
        error: exc.ExecutionStorageError,
        closed_by: dict[str, Any],
    ) -> bool:
        """Fail the instance ``fence`` holds with ``error``, as a terminate does (its
        history rows left as they are); True when it closed."""
        iid = fence.instance_id
        envelope = json.dumps(error_to_envelope(error, codec=self.codec, with_traceback=False))
        if not self.lease_valid(fence):
            return False
        try:
            self.store.instances.terminate(iid, envelope, closed_by, fence=fence)
        except (exc.Fenced, exc.InstanceClosed, exc.WorkflowNotFound):
            return False
        except Exception:
            logger.warning("could not fail %s", iid, exc_info=True, extra={"instance_id": iid})
            self.drop_broken_connection()
            return False
        logger.error("workflow %s failed: %s", iid, error, extra={"instance_id": iid})
        return True

    def release_quietly(self, fence: Fence, *, runnable: bool) -> None:
        """Release the lease on ``fence``; a failure is logged and the lease left to lapse."""
        try:
            self.store.release_lease(fence, runnable=runnable)
        except Exception:
            logger.warning("could not release the lease on %s", fence.instance_id, exc_info=True)
