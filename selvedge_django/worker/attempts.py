"""Activity attempts of one worker: running them (inline or claimed), writing outcomes.

:class:`Attempts` is a member of :class:`~selvedge_django.worker.runtime.WorkerRuntime`
(``runtime.attempts``), built with what it needs: the attempts in flight, the belief
in each claim (the monotonic time until which it is surely unexpired), the outcome
writes that retry a failed database write while the claim holds (its member
``outcomes``, :mod:`.outcomes`), and the attempts that still run after they had to
stop (hung).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

from .. import exceptions as exc
from .. import metrics
from ..conf import SelvedgeSettings
from ..engine.activity import ActivityInfo, AttemptState, attempt_scope
from ..engine.codec import Codec
from ..engine.coroutines import call_activity
from ..engine.events import EV_ACTIVITY_COMPLETED, Fence
from ..engine.execution import current_execution
from ..engine.options import ActivityOptions
from ..engine.ports import ClaimedTask, TaskClaim
from ..registry import get_activity
from ..storage import DjangoStore
from .outcomes import FireHook, Outcomes

__all__ = ["HUNG_AFTER", "Attempts", "HungAttempt"]

logger = logging.getLogger("selvedge_django.worker")

# An attempt whose thread still runs this many seconds after it had to stop (its
# start-to-close deadline passed, its claim was lost, a heartbeat was missed) is hung.
HUNG_AFTER = 1.0
# Seconds a task whose input this worker cannot decode waits before it is claimable
# again (by any worker), so that a worker without the key does not claim it in a loop.
UNDECODABLE_DELAY = 5.0

# Why an attempt was stopped, when the result it still returned is recorded all the same:
# a graceful shutdown (the claim is still held and renewed) and a claim the renewer
# believes lost (the claim check of the write decides).
_RECORDABLE = ("shutdown", "claim lost")


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


class Attempts:
    """Runs a worker's activity attempts and records their outcomes."""

    def __init__(
        self,
        *,
        settings: SelvedgeSettings,
        store: DjangoStore,
        codec: Codec,
        stopping: threading.Event,
        fire: FireHook,
        drop_broken_connection: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.codec = codec
        # Set by the runtime when the worker stops: an attempt claimed now stops at once.
        self.stopping = stopping
        self.fire = fire
        self._lock = threading.Lock()
        # (instance id, key) of the tasks whose input could not be decoded (logged once).
        self._undecodable: set[tuple[str, str]] = set()
        self._attempts: dict[TaskClaim, tuple[ClaimedTask, AttemptState]] = {}
        # The lease of the execution running each inline attempt.
        self._inline: dict[TaskClaim, Fence] = {}
        # Per live attempt, the monotonic time until which its claim is surely unexpired
        # (the start of the last successful claim or renewal statement + the claim TTL).
        self._claim_beliefs: dict[TaskClaim, float] = {}
        # What each attempt came to, written under its claim.
        self.outcomes = Outcomes(
            store=store,
            codec=codec,
            stopping=stopping,
            fire=fire,
            drop_broken_connection=drop_broken_connection,
            claim_belief=self.claim_belief,
        )

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        if self.stopping.is_set() or get_activity(activity_name) is None:
            return False
        if queue in self.settings.queue_rate_limits:
            return False  # only claim_tasks counts a rate-limited queue's claims
        if queue in self.store.pauses.paused_queue_names():
            return False  # a paused queue's tasks stay queued, inline ones too
        queues = self.settings.activity_queues
        return queues is None or queue in queues

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None:
        execution = current_execution()
        return self.run_claimed(
            task, inline_fence=execution.fence if execution is not None else None
        )

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
            if self.outcomes.record(
                claim, "release", functools.partial(self.store.tasks.release_task, claim)
            ):
                released += 1
                logger.info(
                    "claim of %s/%s attempt %s released at shutdown",
                    task.claim.instance_id,
                    task.claim.key,
                    task.attempt,
                )
        return released

    def _leave_undecodable(self, task: ClaimedTask, error: exc.PayloadDecodeError) -> None:
        """Give back a claim whose input this worker cannot decode (a key it lacks).

        No attempt is charged and nothing of the task changes but its claim; it is
        claimable again after UNDECODABLE_DELAY (by any worker: a worker with the
        key runs it then), so this worker does not claim it again in a loop.
        """
        claim = task.claim
        first = (claim.instance_id, claim.key) not in self._undecodable
        if first:
            if len(self._undecodable) >= 10_000:
                self._undecodable.clear()
            self._undecodable.add((claim.instance_id, claim.key))
            logger.warning(
                "cannot decode the input of activity %s of %s (codec %r, key %r): the task is"
                " left for a worker that has the key",
                claim.key,
                claim.instance_id,
                error.codec_id,
                error.key_id,
                extra={"instance_id": claim.instance_id, "key_id": error.key_id},
            )
        self.outcomes.record(
            claim,
            "release",
            functools.partial(
                self.store.tasks.release_task, claim, delay_ms=round(UNDECODABLE_DELAY * 1000)
            ),
        )

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
            self.store.tasks.release_task(claim)
            return None
        try:
            details = self.codec.decode(task.heartbeat_details)
            stored_input = self.codec.decode(task.input)
        except exc.PayloadDecodeError as error:
            self._leave_undecodable(task, error)
            return None
        info = ActivityInfo(
            instance_id=claim.instance_id,
            workflow_name=task.workflow_name,
            activity_id=claim.key,
            activity_name=task.name,
            attempt=task.attempt,
            options=ActivityOptions.from_json(task.options),
            heartbeat_details=details,
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
            codec=self.codec,
            stream_writer=functools.partial(
                self.store.streams.write_live, claim, attempt=task.attempt
            ),
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
        _count_claim(task)
        closed: list[bool] = []  # the completion also closed the instance
        try:
            try:
                value = self.codec.argument(definition.fn, 0, stored_input)
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
                        if inline_fence is not None:
                            # Recorded by the execution's next write, in its transaction
                            # (storage.inline): one commit per inline step.
                            duration = time.monotonic() - started
                            self.store.inline.defer_completion(
                                inline_fence,
                                claim,
                                output,
                                functools.partial(
                                    self.fire,
                                    "on_activity_completed",
                                    duration=duration,
                                    **hook_fields,
                                ),
                            )
                            return EV_ACTIVITY_COMPLETED, output
                        recorded = self.outcomes.record(
                            claim, "result", lambda: self.outcomes.complete(task, output, closed)
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
                self.outcomes.record(claim, "release", lambda: self.store.tasks.release_task(claim))
                return None
            if recorded:
                duration = time.monotonic() - started
                self.fire("on_activity_completed", duration=duration, **hook_fields)
                if closed:  # storage.sole_activity
                    self.fire(
                        "on_workflow_completed",
                        instance_id=claim.instance_id,
                        workflow_name=task.workflow_name,
                        duration=duration,
                    )
                return EV_ACTIVITY_COMPLETED, output
            else:
                metrics.record(metrics.FENCED_WRITES, 1, lease_kind="activity")
                logger.info(
                    "late result of %s/%s attempt %s discarded",
                    claim.instance_id,
                    claim.key,
                    task.attempt,
                )
        except BaseException as error:
            written = self.outcomes.record_failure(
                task,
                state,
                definition.non_retryable_errors,
                error,
                inline_fence,
                duration=time.monotonic() - started,
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

        The store opens it with what its database needs around it (``transactional_attempt``:
        SQLite checks and extends the claim under the write lock). Raises what the body
        raised (its writes rolled back), ``_LateResult`` when the claim was lost,
        ``_RecordFailed`` when the result's write failed.
        """
        entered = False
        try:
            with self.store.attempt_transactions.transactional_attempt(
                task.claim, task.claim_ttl, task.start_to_close_timeout
            ) as before_record:
                entered = True
                return self._transactional_body(fn, value, task, state, inline_fence, before_record)
        except exc.LeaseLost:
            if entered:
                raise  # the body's own
            raise _LateResult() from None

    def _transactional_body(
        self,
        fn: Callable[[Any], Any],
        value: Any,
        task: ClaimedTask,
        state: AttemptState,
        inline_fence: Fence | None,
        before_record: Callable[[], object],
    ) -> str:
        """The body of a transactional attempt and its completion, in the caller's transaction."""
        claim = task.claim
        output = self._encode_result(task.name, call_activity(fn, value, state))
        if state.cancelled and state.cancel_reason not in _RECORDABLE:
            raise exc.ActivityCancelled(state.cancel_reason)
        try:
            before_record()
            completed = self.store.tasks.complete_task(claim, output, inline_fence=inline_fence)
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


def _count_claim(task: ClaimedTask) -> None:
    """The metrics of an attempt's claim: the attempt, its wait, a takeover."""
    if not metrics.enabled():
        return
    name, queue = task.name, task.queue
    metrics.record(metrics.ACTIVITY_ATTEMPTS, 1, activity_name=name, queue=queue)
    if task.waited_ms is not None:
        metrics.record(
            metrics.ACTIVITY_SCHEDULE_TO_START,
            task.waited_ms / 1000,
            activity_name=name,
            queue=queue,
        )
    if task.taken_over:
        metrics.record(metrics.LEASE_TAKEOVERS, 1, lease_kind="activity")
