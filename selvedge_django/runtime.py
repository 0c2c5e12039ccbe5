"""The Django-side runtime an execution runs in: store, codec, clock, leases, attempts.

One :class:`WorkerRuntime` belongs to one :class:`~selvedge_django.worker.Worker`
(or to the client API, which never runs workflow code). It keeps each held
lease's *belief*: the monotonic deadline until which the holder may trust its
lease without asking the database (renewal start + TTL - MARGIN - MAX_SKEW).
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections

from . import exceptions as exc
from . import hooks as hooks_module
from . import local_starts, signals
from .conf import SelvedgeSettings
from .engine.activity import ActivityInfo, AttemptState, attempt_scope
from .engine.codec import Codec, error_to_envelope
from .engine.context import WorkflowContext
from .engine.coroutines import call_activity
from .engine.events import EV_ACTIVITY_COMPLETED, EV_ACTIVITY_FAILED, Fence
from .engine.execution import Execution, current_execution
from .engine.options import ActivityOptions, RetryPolicy
from .engine.ports import (
    ClaimedTask,
    CloseRequest,
    ExecutionOutcome,
    ExecutionSnapshot,
    HistoryLimits,
    TaskClaim,
)
from .registry import get_activity, get_workflow, registered_activity_names
from .storage import InstanceHead, store_for
from .storage import check_vendor as check_vendor
from .storage.errors import backoff_delay, describe, is_data_error

__all__ = ["HUNG_AFTER", "HungAttempt", "WorkerRuntime", "check_vendor", "client_codec"]

logger = logging.getLogger("selvedge_django.worker")

# An attempt whose thread still runs this many seconds after it had to stop (its
# start-to-close deadline passed, its claim was lost, a heartbeat was missed) is hung.
HUNG_AFTER = 1.0

# Why an attempt was stopped, when the result it still returned is recorded all the same:
# a graceful shutdown (the claim is still held and renewed) and a claim the renewer
# believes lost (the claim check of the write decides).
_RECORDABLE = ("shutdown", "claim lost")


def client_codec(settings: SelvedgeSettings) -> Codec:
    return Codec(DjangoJSONEncoder, settings.max_payload_bytes)


@dataclass(frozen=True)
class HungAttempt:
    """An activity attempt whose thread still runs after it had to stop.

    ``reason`` says why it had to stop; ``overdue`` is how many seconds ago. An
    inline attempt (``inline``) holds an execution thread, a background one an
    activity thread, until its code returns: Python cannot stop a thread.
    ``fence`` is the lease of the execution running it inline (else None).
    """

    instance_id: str
    key: str
    activity_name: str
    attempt: int
    inline: bool
    reason: str
    overdue: float
    claim: TaskClaim = field(repr=False)
    fence: Fence | None = field(default=None, repr=False)


class _LateResult(Exception):
    """A transactional attempt lost its claim: roll back its writes."""


class _RecordFailed(Exception):
    """The write of a transactional attempt's result failed: roll back its writes."""


# An outcome write that fails with a database error is tried again, this many times in
# all, with a doubling pause, as long as the claim is still believed valid.
OUTCOME_WRITE_TRIES = 8
OUTCOME_RETRY_FIRST_PAUSE = 0.05
OUTCOME_RETRY_MAX_PAUSE = 2.0


class WorkerRuntime:
    """Everything executions and attempts of one worker share."""

    def __init__(self, settings: SelvedgeSettings) -> None:
        self.settings = settings
        self.codec = client_codec(settings)
        self.store = store_for(settings.database, self.codec, settings)
        self.store.lease_ttl = settings.lease.ttl
        self.store.activity_queues = settings.activity_queues
        self.store.activity_names = registered_activity_names
        self.store.on_closed = local_starts.finished
        self.worker_id = settings.worker_id
        self.hooks = settings.hooks
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._beliefs: dict[Fence, float] = {}
        self._attempts: dict[TaskClaim, tuple[ClaimedTask, AttemptState]] = {}
        # The lease of the execution running each inline attempt.
        self._inline: dict[TaskClaim, Fence] = {}
        # Per live attempt, the monotonic time until which its claim is surely unexpired
        # (the start of the last successful claim or renewal statement + the claim TTL).
        self._claim_beliefs: dict[TaskClaim, float] = {}
        # Monotonic times at which instances this worker held back after a storage error
        # become dispatchable again (the dispatcher polls then).
        self._deferred: list[float] = []

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

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        if self.stopping.is_set() or get_activity(activity_name) is None:
            return False
        queues = self.settings.activity_queues
        return queues is None or queue in queues

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None:
        execution = current_execution()
        return self.run_claimed(
            task, inline_fence=execution.fence if execution is not None else None
        )

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

    def held_fences(self) -> list[Fence]:
        with self._lock:
            return list(self._beliefs)

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
            results = self.store.renew_leases(fences, self.settings.lease.ttl)
        except Exception:
            logger.warning("renewal of %d leases failed", len(fences), exc_info=True)
            self.drop_broken_connection()
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

    @staticmethod
    def _stopped_since(state: AttemptState) -> tuple[float, str] | None:
        """When and why an attempt had to stop for good (a shutdown request is not that)."""
        stops: list[tuple[float, str]] = []
        deadline = state.deadline_monotonic
        if deadline is not None and time.monotonic() >= deadline:
            stops.append((deadline, "start_to_close deadline passed"))
        reason = state.cancel_reason
        if state.cancelled_at is not None and reason not in ("shutdown", ""):
            stops.append((state.cancelled_at, reason))
        return min(stops) if stops else None

    def hung_attempts(self, now: float | None = None) -> list[HungAttempt]:
        """The attempts still running ``HUNG_AFTER`` seconds after they had to stop."""
        now = time.monotonic() if now is None else now
        with self._lock:
            attempts = [
                (task, state, self._inline.get(claim))
                for claim, (task, state) in self._attempts.items()
            ]
        hung = []
        for task, state, fence in attempts:
            stopped = self._stopped_since(state)
            if stopped is None or now - stopped[0] < HUNG_AFTER:
                continue
            claim = task.claim
            hung.append(
                HungAttempt(
                    instance_id=claim.instance_id,
                    key=claim.key,
                    activity_name=task.name,
                    attempt=task.attempt,
                    inline=fence is not None,
                    reason=stopped[1],
                    overdue=now - stopped[0],
                    claim=claim,
                    fence=fence,
                )
            )
        return hung

    # -- attempts -----------------------------------------------------------------------

    def active_attempts(self) -> list[tuple[ClaimedTask, AttemptState]]:
        with self._lock:
            return list(self._attempts.values())

    def cancel_attempts(self, reason: str) -> None:
        for _, state in self.active_attempts():
            state.cancel(reason)

    def claim_belief(self, claim: TaskClaim) -> float:
        """The monotonic time until which ``claim`` is surely unexpired (0: unknown)."""
        with self._lock:
            return self._claim_beliefs.get(claim, 0.0)

    def claim_renewed(self, claim: TaskClaim, renewal_started: float, ttl: float) -> None:
        """Move a live claim's belief forward after a successful renewal."""
        with self._lock:
            if claim in self._claim_beliefs:
                self._claim_beliefs[claim] = renewal_started + ttl

    def release_attempts(self) -> int:
        """Release the claims of attempts still running (end of a graceful shutdown).

        A release consumes the attempt number but not the retry budget; the attempt's
        late result, if it ever comes, is discarded. Returns how many were released.
        """
        released = 0
        for task, _ in self.active_attempts():
            claim = task.claim
            if self._write_outcome(
                claim, "release", functools.partial(self.store.release_task, claim)
            ):
                released += 1
                logger.info(
                    "claim of %s/%s attempt %s released at shutdown",
                    task.claim.instance_id,
                    task.claim.key,
                    task.attempt,
                )
        return released

    def drop_broken_connection(self) -> None:
        """After a database error, close this thread's connection if it no longer works."""
        conn = connections[self.store.alias]
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()

    def _write_outcome(self, claim: TaskClaim, what: str, write: Callable[[], bool]) -> bool:
        """Run one write of an attempt's outcome; retry a database error with backoff.

        A failed statement is the infrastructure's fault, never the activity's: the
        write is tried again (``OUTCOME_WRITE_TRIES`` in all, pauses doubling from
        ``OUTCOME_RETRY_FIRST_PAUSE``) while the claim is still believed valid. After
        that the claim is left to lapse, and the lapse path decides (False).
        """
        pause = OUTCOME_RETRY_FIRST_PAUSE
        for tries in range(1, OUTCOME_WRITE_TRIES + 1):
            try:
                return write()
            except DatabaseError:
                self.drop_broken_connection()
                valid_until = self.claim_belief(claim)
                if tries == OUTCOME_WRITE_TRIES or time.monotonic() + pause >= valid_until:
                    logger.warning(
                        "could not record the %s of %s/%s after %d tries; the claim is left"
                        " to lapse",
                        what,
                        claim.instance_id,
                        claim.key,
                        tries,
                        exc_info=True,
                    )
                    return False
                logger.info(
                    "recording the %s of %s/%s failed; trying again in %.2f s",
                    what,
                    claim.instance_id,
                    claim.key,
                    pause,
                    exc_info=True,
                )
                time.sleep(pause)
                pause = min(pause * 2, OUTCOME_RETRY_MAX_PAUSE)
        return False  # pragma: no cover - the loop returns

    def run_claimed(
        self,
        task: ClaimedTask,
        *,
        inline_fence: Fence | None = None,
        claimed_at: float | None = None,
    ) -> tuple[str, str] | None:
        """Run one claimed attempt and record its outcome, fenced by the claim.

        ``claimed_at`` is the monotonic time before the claim statement (default:
        now), where the claim's belief starts. Returns the (event type, data) this
        attempt wrote to history, if any.
        """
        definition = get_activity(task.name)
        claim = task.claim
        if claimed_at is None:
            claimed_at = time.monotonic()
        if definition is None:
            self.store.release_task(claim)
            return None
        info = ActivityInfo(
            instance_id=claim.instance_id,
            workflow_name=task.workflow_name,
            activity_id=claim.key,
            activity_name=task.name,
            attempt=task.attempt,
            options=ActivityOptions.from_json(task.options),
        )
        started = time.monotonic()
        # The deadline runs from the claim, as in the database: not from this thread's
        # start, which a busy machine or a full pool may delay well after it.
        state = AttemptState(
            info,
            deadline_monotonic=(task.claimed_at if task.claimed_at is not None else claimed_at)
            + task.start_to_close_timeout
            if task.start_to_close_timeout is not None
            else None,
        )
        with self._lock:
            self._attempts[claim] = (task, state)
            self._claim_beliefs[claim] = claimed_at + task.claim_ttl
            if inline_fence is not None:
                self._inline[claim] = inline_fence
        if self.stopping.is_set():
            state.cancel("shutdown")  # claimed as the shutdown began: stop at once
        hook_fields = dict(
            instance_id=claim.instance_id,
            workflow_name=task.workflow_name,
            key=claim.key,
            activity_name=task.name,
            attempt=task.attempt,
        )
        self.fire("on_activity_started", **hook_fields)
        try:
            try:
                value = json.loads(task.input)
                with attempt_scope(state):
                    if definition.transactional:
                        output = self._run_transactional(
                            definition.fn, value, task, state, inline_fence
                        )
                        recorded = True
                    else:
                        result = call_activity(definition.fn, value, state)
                        output = self._encode_result(task.name, result)
                        if state.cancelled and state.cancel_reason not in _RECORDABLE:
                            raise exc.ActivityCancelled(state.cancel_reason)
                        recorded = self._write_outcome(
                            claim,
                            "result",
                            lambda: self.store.complete_task(
                                claim, output, inline_fence=inline_fence
                            ),
                        )
            except _LateResult:
                recorded = False
            except _RecordFailed:
                # The attempt's own writes rolled back with the failed write, so it may
                # run again: give the claim back without using the retry budget.
                logger.warning(
                    "could not record the result of transactional %s/%s attempt %s;"
                    " its writes were rolled back and the claim is released",
                    claim.instance_id,
                    claim.key,
                    task.attempt,
                    exc_info=True,
                )
                self._write_outcome(claim, "release", lambda: self.store.release_task(claim))
                return None
            if recorded:
                self.fire(
                    "on_activity_completed", duration=time.monotonic() - started, **hook_fields
                )
                return EV_ACTIVITY_COMPLETED, output
            else:
                logger.info(
                    "late result of %s/%s attempt %s discarded",
                    claim.instance_id,
                    claim.key,
                    task.attempt,
                )
        except BaseException as error:
            written = self._record_failure(
                task, state, definition.non_retryable_errors, error, inline_fence
            )
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            return written
        finally:
            with self._lock:
                self._attempts.pop(claim, None)
                self._claim_beliefs.pop(claim, None)
                self._inline.pop(claim, None)
        return None

    def _run_transactional(
        self,
        fn: Callable[[Any], Any],
        value: Any,
        task: ClaimedTask,
        state: AttemptState,
        inline_fence: Fence | None,
    ) -> str:
        """Run a transactional attempt: its body and its result commit in one transaction.

        Raises what the body raised (its writes rolled back), ``_LateResult`` when the
        claim was lost, ``_RecordFailed`` when the result's write failed.
        """
        store = self.store
        if not store.single_writer:
            with store.atomic():
                # A body may wait on other things inside its transaction: a role's
                # idle_in_transaction_session_timeout would end the session every time.
                store.allow_idle_transaction(task.start_to_close_timeout)
                return self._transactional_body(fn, value, task, state, inline_fence)
        # SQLite: the transaction holds the database's write lock from BEGIN IMMEDIATE to
        # its end, so nobody can renew this claim meanwhile, and nobody can take it over
        # either. The claim must be live when the lock is taken; then the attempt extends
        # its own claim (its deadline permitting) before it records the outcome, and, when
        # the body fails, after rolling the body back to a savepoint, so that the failure
        # is recorded as this attempt's own, not as a lapse.
        claim = task.claim
        failure: BaseException | None = None
        with store.atomic():
            if not store.claim_live(claim):
                raise _LateResult()
            try:
                with store.atomic():  # a savepoint: the body's writes
                    return self._transactional_body(fn, value, task, state, inline_fence)
            except BaseException as error:
                failure = error
                try:
                    store.extend_claim_under_lock(claim, task.claim_ttl)
                except DatabaseError:
                    logger.debug(
                        "could not extend the claim of %s/%s", claim.instance_id, claim.key
                    )
        raise failure

    def _transactional_body(
        self,
        fn: Callable[[Any], Any],
        value: Any,
        task: ClaimedTask,
        state: AttemptState,
        inline_fence: Fence | None,
    ) -> str:
        """The body of a transactional attempt and its completion, in the caller's transaction."""
        claim = task.claim
        output = self._encode_result(task.name, call_activity(fn, value, state))
        if state.cancelled and state.cancel_reason not in _RECORDABLE:
            raise exc.ActivityCancelled(state.cancel_reason)
        try:
            if self.store.single_writer:
                self.store.extend_claim_under_lock(claim, task.claim_ttl)
            completed = self.store.complete_task(claim, output, inline_fence=inline_fence)
        except DatabaseError as error:
            raise _RecordFailed() from error
        if not completed:
            raise _LateResult()
        return output

    def _encode_result(self, name: str, value: Any) -> str:
        """Encode an attempt's return value; one that is not JSON fails the attempt."""
        try:
            return self.codec.encode(value, f"result of activity {name!r}")
        except (exc.PayloadTooLarge, exc.PayloadTooDeep):
            raise
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"activity {name!r} returned a value that is not JSON: {error}"
            ) from error

    def _record_failure(
        self,
        task: ClaimedTask,
        state: AttemptState,
        non_retryable: tuple[type[BaseException], ...],
        error: BaseException,
        inline_fence: Fence | None,
    ) -> tuple[str, str] | None:
        """Record a failed attempt: release, retry or final failure. Return what was written."""
        claim = task.claim
        hook_fields = dict(
            instance_id=claim.instance_id,
            workflow_name=task.workflow_name,
            key=claim.key,
            activity_name=task.name,
            attempt=task.attempt,
        )
        if self.stopping.is_set() and state.cancel_reason == "shutdown":
            # Graceful release: another worker takes the task; no retry budget used.
            self._write_outcome(claim, "release", lambda: self.store.release_task(claim))
            return None
        if state.cancelled and state.cancel_reason == "heartbeat timeout":
            error = exc.ActivityTimeoutError(task.name, "heartbeat", task.attempt)
        elif (
            state.cancelled
            and state.deadline_monotonic is not None
            and (time.monotonic() >= state.deadline_monotonic)
        ):
            error = exc.ActivityTimeoutError(task.name, "start_to_close", task.attempt)
        policy_data = task.options.get("retry_policy") or {}
        policy = RetryPolicy.from_json(policy_data)
        final = (
            (isinstance(error, exc.ApplicationError) and error.non_retryable)
            or (bool(non_retryable) and isinstance(error, non_retryable))
            # A retry cannot make an oversized or too deep result fit.
            or isinstance(error, exc.PayloadTooLarge | exc.PayloadTooDeep)
            or not isinstance(error, Exception)
        )
        if not isinstance(error, Exception):
            error = exc.WorkflowPanicError(f"activity raised {type(error).__name__}: {error}")
        failures = task.failures + 1
        envelope = json.dumps(error_to_envelope(error, codec=self.codec))
        store = self.store
        try:
            if final:
                if self._write_outcome(
                    claim,
                    "failure",
                    lambda: store.fail_task(claim, envelope, inline_fence=inline_fence),
                ):
                    self.fire("on_activity_failed", error=error, **hook_fields)
                    return EV_ACTIVITY_FAILED, envelope
            elif policy.exhausted(failures):
                exhausted = exc.RetryExhaustedError(task.name, failures, error)
                final_envelope = json.dumps(error_to_envelope(exhausted, codec=self.codec))
                if self._write_outcome(
                    claim,
                    "failure",
                    lambda: store.fail_task(
                        claim, final_envelope, inline_fence=inline_fence, last_error=envelope
                    ),
                ):
                    self.fire("on_activity_failed", error=exhausted, **hook_fields)
                    return EV_ACTIVITY_FAILED, final_envelope
            elif self._write_outcome(
                claim,
                "retry",
                lambda: store.retry_task(claim, envelope, policy.delay_for(failures)),
            ):
                self.fire("on_activity_retry", error=error, **hook_fields)
        except Exception:
            logger.exception("could not record the failure of %s/%s", claim.instance_id, claim.key)
        return None

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
            self.drop(fence)

    def _execute(
        self, fence: Fence, snapshot: ExecutionSnapshot | None, head: InstanceHead | None
    ) -> ExecutionOutcome | None:
        store = self.store
        if snapshot is None:
            try:
                snapshot = store.load_snapshot(
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
        if len(snapshot.history) > self.settings.history_warning_threshold:
            logger.warning(
                "instance %s has %d history events (threshold %d)",
                fence.instance_id,
                len(snapshot.history),
                self.settings.history_warning_threshold,
                extra={"instance_id": fence.instance_id},
            )
        base = dict(instance_id=fence.instance_id, workflow_name=snapshot.workflow_name)
        if snapshot.history:
            self.fire("on_workflow_replayed", **base)
        execution = Execution(self, snapshot, fence)
        started = time.monotonic()
        outcome = execution.run(definition.fn, WorkflowContext(execution, execution.root_scope))
        try:
            self._finish(execution, outcome)
        except exc.Fenced:
            logger.info("execution of %s was fenced out at close", fence.instance_id)
            outcome.kind = "abandoned"  # nothing was closed: no close hooks
        except Exception as error:
            # The close or the release failed (or committed, and the connection was lost
            # before it said so: then the lease is no longer held, and nothing is done).
            failure = self._after_storage_error(fence, error)
            outcome.kind = "abandoned" if failure is None else "failed"
            outcome.error = error if failure is None else failure
        if outcome.kind in ("completed", "failed", "cancelled"):
            self.fire(
                f"on_workflow_{outcome.kind}",
                error=outcome.error,
                duration=time.monotonic() - started,
                **base,
            )
        elif outcome.kind == "suspended":
            self.fire("on_workflow_suspended", **base)
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
            self._release_quietly(fence, runnable=True)
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
        if outcome.kind == "suspended":
            if not execution.released:
                self.store.release_lease(fence)
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
            if error is None or isinstance(error, exc.LeaseLost | exc.HistoryKeyConflict):
                logger.warning("execution of %s abandoned: %r", fence.instance_id, error)
                self._release_quietly(fence, runnable=True)
                return
            # A store operation failed: replaying at once could fail the same way forever.
            failure = self._after_storage_error(fence, error)
            if failure is not None:
                outcome.kind, outcome.error = "failed", failure
            return
        request = execution.close_request(outcome)
        if not self.lease_valid(fence):
            logger.warning("lease on %s lost before close; not closing", fence.instance_id)
            self._release_quietly(fence, runnable=True)
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
            before = self.store.execution_errors(fence)
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
            held = self.store.defer_execution(fence, errors, delay, message)
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
            self.store.terminate(iid, envelope, closed_by, fence=fence)
        except (exc.Fenced, exc.InstanceClosed, exc.WorkflowNotFound):
            return False
        except Exception:
            logger.warning("could not fail %s", iid, exc_info=True, extra={"instance_id": iid})
            self.drop_broken_connection()
            return False
        logger.error("workflow %s failed: %s", iid, error, extra={"instance_id": iid})
        return True

    def _release_quietly(self, fence: Fence, *, runnable: bool) -> None:
        try:
            self.store.release_lease(fence, runnable=runnable)
        except Exception:
            logger.warning("could not release the lease on %s", fence.instance_id, exc_info=True)
