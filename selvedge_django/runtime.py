"""The Django-side runtime an execution runs in: store, codec, clock, leases, attempts.

One :class:`WorkerRuntime` belongs to one :class:`~selvedge_django.worker.Worker`
(or to the client API, which never runs workflow code). It keeps each held
lease's *belief*: the monotonic deadline until which the holder may trust its
lease without asking the database (renewal start + TTL - MARGIN - MAX_SKEW).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections

from . import exceptions as exc
from . import hooks as hooks_module
from . import signals
from .conf import SelvedgeSettings
from .engine.activity import ActivityInfo, AttemptState, attempt_scope
from .engine.codec import Codec, error_to_envelope
from .engine.coroutines import call_activity
from .engine.execution import Execution, ExecutionOutcome, HistoryLimits, current_execution
from .engine.options import ActivityOptions, RetryPolicy
from .engine.store import (
    EV_ACTIVITY_COMPLETED,
    EV_ACTIVITY_FAILED,
    ClaimedTask,
    CloseRequest,
    ExecutionSnapshot,
    Fence,
    TaskClaim,
)
from .registry import get_activity, get_workflow, registered_activity_names
from .store import DjangoStore, InstanceHead

__all__ = ["WorkerRuntime", "check_vendor", "client_codec"]

logger = logging.getLogger("selvedge_django.worker")

SUPPORTED_VENDORS = ("sqlite", "postgresql")


def check_vendor(alias: str) -> None:
    """Refuse database vendors other than SQLite and PostgreSQL."""
    from django.core.exceptions import ImproperlyConfigured

    vendor = connections[alias].vendor
    if vendor not in SUPPORTED_VENDORS:
        raise ImproperlyConfigured(
            f"selvedge_django supports SQLite and PostgreSQL; database {alias!r} is {vendor!r}"
        )


def client_codec(settings: SelvedgeSettings) -> Codec:
    return Codec(DjangoJSONEncoder, settings.max_payload_bytes)


class _LateResult(Exception):
    """A transactional attempt lost its claim: roll back its writes."""


class WorkerRuntime:
    """Everything executions and attempts of one worker share."""

    def __init__(self, settings: SelvedgeSettings) -> None:
        check_vendor(settings.database)
        self.settings = settings
        self.codec = client_codec(settings)
        self.store = DjangoStore(settings.database, self.codec)
        self.store.lease_ttl = settings.lease.ttl
        self.store.activity_queues = settings.activity_queues
        self.store.activity_names = registered_activity_names
        if settings.listen_notify is not None:
            self.store.notify_enabled = settings.listen_notify and self.store.vendor == "postgresql"
        self.worker_id = settings.worker_id
        self.hooks = settings.hooks
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._beliefs: dict[Fence, float] = {}
        self._attempts: dict[TaskClaim, tuple[ClaimedTask, AttemptState]] = {}

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

    def renew(self, fence: Fence) -> bool:
        """Renew one lease and move its belief forward; a failed renewal loses it."""
        started = time.monotonic()
        try:
            ok = self.store.renew_lease(fence, self.settings.lease.ttl)
        except Exception:
            logger.warning("lease renewal of %s failed", fence.instance_id, exc_info=True)
            return False
        with self._lock:
            if fence in self._beliefs:
                self._beliefs[fence] = started + self.settings.lease.belief if ok else 0.0
        return ok

    # -- attempts -----------------------------------------------------------------------

    def active_attempts(self) -> list[tuple[ClaimedTask, AttemptState]]:
        with self._lock:
            return list(self._attempts.values())

    def cancel_attempts(self, reason: str) -> None:
        for _, state in self.active_attempts():
            state.cancel(reason)

    def run_claimed(
        self, task: ClaimedTask, *, inline_fence: Fence | None = None
    ) -> tuple[str, str] | None:
        """Run one claimed attempt and record its outcome, fenced by the claim.

        Returns the (event type, data) this attempt wrote to history, if any.
        """
        definition = get_activity(task.name)
        claim = task.claim
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
        state = AttemptState(
            info,
            deadline_monotonic=started + task.start_to_close_timeout
            if task.start_to_close_timeout is not None
            else None,
        )
        with self._lock:
            self._attempts[claim] = (task, state)
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
                        with self.store.atomic():
                            output = self._encode_result(
                                task.name, call_activity(definition.fn, value, state)
                            )
                            if state.cancelled:
                                raise exc.ActivityCancelled(state.cancel_reason)
                            if not self.store.complete_task(
                                claim, output, inline_fence=inline_fence
                            ):
                                raise _LateResult()
                        recorded = True
                    else:
                        result = call_activity(definition.fn, value, state)
                        output = self._encode_result(task.name, result)
                        if state.cancelled and state.cancel_reason != "claim lost":
                            raise exc.ActivityCancelled(state.cancel_reason)
                        recorded = self.store.complete_task(
                            claim, output, inline_fence=inline_fence
                        )
            except _LateResult:
                recorded = False
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
        return None

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
            self.store.release_task(claim)
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
        try:
            if final:
                if self.store.fail_task(claim, envelope, inline_fence=inline_fence):
                    self.fire("on_activity_failed", error=error, **hook_fields)
                    return EV_ACTIVITY_FAILED, envelope
            elif policy.exhausted(failures):
                exhausted = exc.RetryExhaustedError(task.name, failures, error)
                final_envelope = json.dumps(error_to_envelope(exhausted, codec=self.codec))
                if self.store.fail_task(
                    claim, final_envelope, inline_fence=inline_fence, last_error=envelope
                ):
                    self.fire("on_activity_failed", error=exhausted, **hook_fields)
                    return EV_ACTIVITY_FAILED, final_envelope
            elif self.store.retry_task(claim, envelope, policy.delay_for(failures)):
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
        outcome = execution.run(definition.fn)
        try:
            self._finish(execution, outcome)
        except exc.Fenced:
            logger.info("execution of %s was fenced out at close", fence.instance_id)
            outcome.kind = "abandoned"  # nothing was closed: no close hooks
        except Exception:
            logger.exception("could not finish execution of %s", fence.instance_id)
            self._release_quietly(fence, runnable=True)
            return outcome
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
            if not isinstance(outcome.error, exc.Fenced):
                logger.warning("execution of %s abandoned: %r", fence.instance_id, outcome.error)
                self._release_quietly(fence, runnable=True)
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

    def _release_quietly(self, fence: Fence, *, runnable: bool) -> None:
        try:
            self.store.release_lease(fence, runnable=runnable)
        except Exception:
            logger.warning("could not release the lease on %s", fence.instance_id, exc_info=True)
