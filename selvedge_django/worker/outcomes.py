"""The outcomes of a worker's activity attempts: claim-checked writes, retried.

:class:`Outcomes` is a member of :class:`~selvedge_django.worker.attempts.Attempts`
(``attempts.outcomes``): it writes what an attempt came to (a success, a retry, a
final failure, a release) under the attempt's claim, tries a write the database
refused again while the claim is believed valid, commits the successes of attempts
that finish together together on SQLite (:mod:`.group_commit`), and records the
inline results no write of their execution took.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.db import DatabaseError

from .. import exceptions as exc
from ..engine.activity import AttemptState
from ..engine.codec import Codec, error_to_envelope
from ..engine.events import EV_ACTIVITY_FAILED, Fence
from ..engine.options import RetryPolicy
from ..engine.ports import ClaimedTask, TaskClaim
from ..registry import get_workflow
from ..storage import DjangoStore, attempt_error_data
from .group_commit import GroupCommit

__all__ = ["FireHook", "Outcomes"]

logger = logging.getLogger("selvedge_django.worker")

# An outcome write that fails with a database error is tried again, this many times in
# all, with a doubling pause, as long as the claim is still believed valid.
OUTCOME_WRITE_TRIES = 8
OUTCOME_RETRY_FIRST_PAUSE = 0.05
OUTCOME_RETRY_MAX_PAUSE = 2.0


class FireHook(Protocol):
    """Fire a hook and its signal with the worker's fields (``WorkerRuntime.fire``)."""

    def __call__(self, hook: str, **fields: Any) -> None: ...


class Outcomes:
    """Writes the outcomes of a worker's activity attempts, each under its claim."""

    def __init__(
        self,
        *,
        store: DjangoStore,
        codec: Codec,
        stopping: threading.Event,
        fire: FireHook,
        drop_broken_connection: Callable[[], None],
        claim_belief: Callable[[TaskClaim], float],
    ) -> None:
        self.store = store
        self.codec = codec
        self.stopping = stopping
        self.fire = fire
        self.drop_broken_connection = drop_broken_connection
        # Until when (monotonic) a claim is surely unexpired: Attempts keeps the beliefs.
        self._claim_belief = claim_belief
        # The successes of attempts that finish together commit together.
        self._group = GroupCommit(store)

    def record(
        self,
        claim: TaskClaim,
        what: str,
        write: Callable[[], bool],
        *,
        past_belief: bool = False,
    ) -> bool:
        """Run one write of an attempt's outcome; retry a database error with backoff.

        A failed statement is the infrastructure's fault, never the activity's: the
        write is tried again (``OUTCOME_WRITE_TRIES`` in all, pauses doubling from
        ``OUTCOME_RETRY_FIRST_PAUSE``) while the claim is still believed valid, or
        regardless of that belief with ``past_belief`` (a claim-checked write whose
        attempt is no longer tracked). After that the claim is left to lapse, and
        the lapse path decides (False).
        """
        pause = OUTCOME_RETRY_FIRST_PAUSE
        for tries in range(1, OUTCOME_WRITE_TRIES + 1):
            try:
                return write()
            except DatabaseError:
                self.drop_broken_connection()
                valid_until = self._claim_belief(claim)
                out_of_time = not past_belief and time.monotonic() + pause >= valid_until
                if tries == OUTCOME_WRITE_TRIES or out_of_time:
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

    def flush_inline_results(self, fence: Fence) -> None:
        """Record, each on its own, inline results that no write of the execution took
        (it was fenced out, or a write failed): as a background attempt records its own,
        trying again while the database refuses the write (a row a client holds, a
        statement timeout, a connection the server ended). The write is claim-checked,
        so a claim that lapsed meanwhile records nothing and the activity runs again."""
        if not self.store.inline.has_deferred(fence):
            return
        for claim, output, on_recorded in self.store.inline.take_deferred(fence):
            write = functools.partial(self.store.tasks.complete_task, claim, output)
            recorded = self.record(claim, "inline result", write, past_belief=True)
            if recorded and on_recorded is not None:
                on_recorded()

    def complete(self, task: ClaimedTask, output: str, closed: list[bool]) -> bool:
        """Record a background attempt's success (False: the claim was lost).

        The only activity of an instance whose workflow returns its result, reserved by
        the start (``WorkflowDefinition.result_activity``), closes the instance in the
        same transaction when nothing else happened to it since (``closed`` then holds
        True). The write joins those of the attempts finishing at the same moment in
        one transaction (:mod:`.group_commit`).
        """
        outcome = self._group.submit(
            lambda: self._record_success(task, output),
            lambda: self._record_success(task, output, if_free=True),
        )
        closed[:] = [True] if outcome == "closed" else []
        return outcome != "lost"

    def _record_success(self, task: ClaimedTask, output: str, *, if_free: bool = False) -> str:
        """Write a success: ``"lost"`` (the claim), ``"recorded"`` or ``"closed"``
        (``if_free``: as one of a batch, raising RowBusy rather than wait for a row)."""
        claim = task.claim
        workflow = get_workflow(task.workflow_name)
        if workflow is None or workflow.result_activity != claim.key:
            recorded = self.store.tasks.complete_task(claim, output, if_free=if_free)
            return "recorded" if recorded else "lost"
        outcome = self.store.sole_activity.complete_closing(claim, output, if_free=if_free)
        return "lost" if outcome is None else "closed" if outcome else "recorded"

    def record_failure(
        self,
        task: ClaimedTask,
        state: AttemptState,
        non_retryable: tuple[type[BaseException], ...],
        error: BaseException,
        inline_fence: Fence | None,
        *,
        duration: float | None = None,
    ) -> tuple[str, str] | None:
        """Record a failed attempt: release, retry or final failure. Return what was written."""
        claim = task.claim
        hook_fields = dict(
            instance_id=claim.instance_id,
            workflow_name=task.workflow_name,
            key=claim.key,
            activity_name=task.name,
            attempt=task.attempt,
            duration=duration,
        )
        if self.stopping.is_set() and state.cancel_reason == "shutdown":
            # Graceful release: another worker takes the task (from the latest heartbeat
            # details); no retry budget used.
            self.record(
                claim,
                "release",
                lambda: self.store.tasks.release_task(claim, details=state.details),
            )
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
            # A retry cannot make an oversized or too deep result fit, nor a stored input
            # that does not fit the activity's annotation.
            or isinstance(
                error, exc.PayloadTooLarge | exc.PayloadTooDeep | exc.PayloadConversionError
            )
            or not isinstance(error, Exception)
        )
        if not isinstance(error, Exception):
            error = exc.WorkflowPanicError(f"activity raised {type(error).__name__}: {error}")
        failures = task.failures + 1
        envelope = attempt_error_data(error, claim.owner, self.codec)
        store = self.store
        try:
            if final:
                if self.record(
                    claim,
                    "failure",
                    lambda: store.tasks.fail_task(claim, envelope, inline_fence=inline_fence),
                ):
                    self.fire("on_activity_failed", error=error, **hook_fields)
                    return EV_ACTIVITY_FAILED, envelope
            elif policy.exhausted(failures):
                exhausted = exc.RetryExhaustedError(task.name, failures, error)
                final_envelope = json.dumps(error_to_envelope(exhausted, codec=self.codec))
                if self.record(
                    claim,
                    "failure",
                    lambda: store.tasks.fail_task(
                        claim, final_envelope, inline_fence=inline_fence, last_error=envelope
                    ),
                ):
                    self.fire("on_activity_failed", error=exhausted, **hook_fields)
                    return EV_ACTIVITY_FAILED, final_envelope
            elif self.record(
                claim,
                "retry",
                lambda: store.tasks.retry_task(
                    claim, envelope, policy.delay_for(failures), details=state.details
                ),
            ):
                self.fire("on_activity_retry", error=error, **hook_fields)
        except Exception:
            logger.exception("could not record the failure of %s/%s", claim.instance_id, claim.key)
        return None
