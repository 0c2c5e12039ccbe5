"""Handles on outcomes that arrive later: activity futures, timers and child workflows.

``get()`` consumes no command position and delivers no batch: it returns a
stored outcome (which always wins over cancellation), observes cancellation of
its *issuing* scope, runs a claimable activity inline, or suspends.
``is_ready()`` reads the delivered view (or an outcome ``get()`` returned).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Generic, TypeVar

from .. import exceptions as exc
from .codec import decode_time, error_from_envelope, parse_time
from .events import (
    CMD_ACTIVITY,
    CMD_CHILD,
    CMD_CHILD_CANCEL,
    CMD_SLEEP,
    EV_ACTIVITY_CANCELLED,
    EV_ACTIVITY_COMPLETED,
    EV_CHILD_CANCEL_REQUESTED,
    EV_CHILD_CANCELLED,
    EV_CHILD_COMPLETED,
    EV_TIMER_CANCELLED,
    EV_TIMER_EXPIRED,
    HistoryRow,
    error_data,
    reservation_of,
)
from .execution import Execution
from .ports import ClaimedTask, Observation
from .scope import Scope

__all__ = ["ChildHandle", "Future", "Timer", "decode_outcome"]

OutT_co = TypeVar("OutT_co", covariant=True)


def decode_outcome(row: HistoryRow, execution: Any = None, *, raise_it: bool = True) -> Any:
    """Return a stored success value, or raise (or return) the stored error.

    A recorded value that is not JSON raises :class:`ReplayDecodeError`; one that
    ``execution`` cannot decrypt stops it (:meth:`Execution.decode_stored`).
    """
    try:
        if execution is not None:
            value = execution.decode_stored(row.data)
        else:
            value = json.loads(row.data) if row.data is not None else None
    except (ValueError, RecursionError) as bad:
        raise exc.ReplayDecodeError(
            f"recorded value of {row.key!r} is not JSON: {bad}"[:500]
        ) from None
    if row.event_type in (EV_ACTIVITY_COMPLETED, EV_CHILD_COMPLETED):
        return value
    if isinstance(value, dict):
        if execution is not None:
            value = execution.open_stored_error(value)
        error = error_from_envelope(value)
    else:
        error = exc.Cancelled() if "Cancel" in row.event_type else exc.ApplicationError(str(value))
    if raise_it:
        raise error
    return error


class _Handle:
    command = ""

    def __init__(self, execution: Execution, scope: Scope, key: str) -> None:
        self._execution = execution
        self._scope = scope
        self._key = key
        self._resolved: HistoryRow | None = None

    @property
    def key(self) -> str:
        """The history key assigned when the command was issued."""
        return self._key

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._key!r} ready={self.is_ready()}>"

    def is_ready(self) -> bool:
        """True when the outcome was delivered, or a get() already returned it."""
        return self._resolved is not None or self._execution.visible(self._key)

    def _stored(self) -> HistoryRow | None:
        execution = self._execution
        row = execution.history.get(self._key)
        if row is not None and row.has_value:
            return row
        if execution.readonly:
            return None
        fresh = execution.refresh(self._key)
        return fresh if fresh is not None and fresh.has_value else None

    def _resolve(self, row: HistoryRow) -> HistoryRow:
        self._resolved = row
        self._execution.observed.add(self._key)
        return row

    def _cancel_on_wait(self) -> HistoryRow | None:
        """Observe the issuing scope's cancellation; return the stored outcome then."""
        execution = self._execution
        error = execution.cancellation(self._scope)
        if error is None:
            return None
        return self._record_cancelled(error)

    def _record_cancelled(self, error: BaseException) -> HistoryRow:
        raise NotImplementedError


class Future(_Handle, Generic[OutT_co]):
    """An activity outcome tied to the execution that issued it (``get()`` returns it)."""

    command = CMD_ACTIVITY

    def __init__(
        self,
        execution: Execution,
        scope: Scope,
        key: str,
        activity_name: str,
        result_fn: Any = None,
    ) -> None:
        super().__init__(execution, scope, key)
        self._activity_name = activity_name
        self._claimed: ClaimedTask | None = None
        # The activity's function: its return annotation types the result (converter).
        self._result_fn = result_fn

    def get(self, ctx: object = None) -> OutT_co:
        """Return the activity's result, raise its error, or suspend until it exists."""
        if self._resolved is None:
            self._execution.check_command("Future.get()")
            row = self._lookup()
            while row is None:  # again after each wait the worker's cache continues
                self._execution.wait_here(f"activity {self._key!r} has no outcome yet")
                row = self._lookup()
            self._resolve(row)
            if self._execution.is_replaying and self._execution.live:
                self._execution.runtime.fire(
                    "on_activity_cache_hit",
                    instance_id=self._execution.instance_id,
                    workflow_name=self._execution.workflow_name,
                    key=self._key,
                    activity_name=self._activity_name,
                )
        assert self._resolved is not None
        return self._execution.runtime.codec.result(
            self._result_fn, decode_outcome(self._resolved, self._execution)
        )

    def _lookup(self) -> HistoryRow | None:
        execution = self._execution
        task, self._claimed = self._claimed, None
        if task is None and execution.released:
            return None  # nothing may be read or written under the released lease
        if task is None:
            stored = self._stored()
            if stored is not None or execution.readonly:
                return stored
            cancelled = self._cancel_on_wait()
            if cancelled is not None:
                return cancelled
            queue = str(reservation_of(execution.history.get(self._key)).get("queue", ""))
            if not execution.runtime.can_run_inline(self._activity_name, queue):
                return None
            store = execution.runtime.store
            task = execution.guarded(
                lambda: store.claim_task(
                    execution.instance_id, self._key, execution.runtime.worker_id
                )
            )
            if task is None:
                return None
        with execution.running_activity():
            written = execution.runtime.run_attempt(task)
        if written is None:
            return self._stored()
        # The attempt recorded the first value at this key: no need to read it back.
        reserved = execution.history.get(self._key)
        row = HistoryRow(
            self._key,
            reserved.seq if reserved is not None else None,
            CMD_ACTIVITY,
            written[0],
            written[1],
            reserved.reservation if reserved is not None else None,
        )
        execution.keep_row(self._key, row)
        return row

    def _record_cancelled(self, error: BaseException) -> HistoryRow:
        execution = self._execution
        result = execution.observe(
            Observation(
                execution.seq,
                fill=HistoryRow(
                    self._key, None, CMD_ACTIVITY, EV_ACTIVITY_CANCELLED, error_data(error)
                ),
                cancel_tasks=(self._key,),
            )
        )
        assert result.stored is not None
        return result.stored


class Timer(_Handle):
    """A durable timer tied to its issuing execution."""

    command = CMD_SLEEP

    def get(self, ctx: object = None) -> datetime:
        """Return the recorded expiry (aware UTC), or raise the timer's cancellation."""
        return self._wait(batch=False)

    def _remaining(self) -> float | None:
        """Seconds of workflow time until the timer fires, from its reservation (or None)."""
        expires = reservation_of(self._execution.history.get(self._key)).get("expires_at")
        if not isinstance(expires, str):
            return None
        return (parse_time(expires) - self._execution.time_base()).total_seconds()

    def _wait(self, *, batch: bool) -> datetime:
        execution = self._execution
        if self._resolved is None:
            execution.check_command("Timer.get()")
            row = self._stored()
            if row is None and execution.live:
                row = self._cancel_on_wait(batch=batch)
            while row is None:  # again after each wait the worker's cache continues
                execution.wait_here(f"timer {self._key!r} has not fired", self._remaining())
                row = self._stored() or self._cancel_on_wait(batch=batch)
            self._resolve(row)
        row = self._resolved
        assert row is not None
        if row.event_type == EV_TIMER_EXPIRED:
            value = decode_time(row.data or "null")
            execution.advance_floor(value)
            return value
        raised = decode_outcome(row, execution, raise_it=False)
        raise raised

    def _cancel_on_wait(self, batch: bool = False) -> HistoryRow | None:
        execution = self._execution
        error = execution.cancellation(self._scope)
        if error is None:
            return None
        result = execution.observe(
            Observation(
                execution.seq,
                fill=HistoryRow(self._key, None, CMD_SLEEP, EV_TIMER_CANCELLED, error_data(error)),
                retire_timer=self._key,
                deliver_all=batch,
            )
        )
        assert result.stored is not None
        return result.stored


class ChildHandle(_Handle, Generic[OutT_co]):
    """A child workflow's outcome, tied to the parent's execution (``get()`` returns it)."""

    command = CMD_CHILD

    def __init__(
        self, execution: Execution, scope: Scope, key: str, child_id: str, result_fn: Any = None
    ) -> None:
        super().__init__(execution, scope, key)
        self._child_id = child_id
        self._cancel_issued = False
        # The child workflow's function, when started by its definition (converter).
        self._result_fn = result_fn

    @property
    def id(self) -> str:
        """The child's instance id (set even when a cancelled scope prevented its start)."""
        return self._child_id

    def get(self, ctx: object = None) -> OutT_co:
        """Return the child's result, raise its error, or suspend until it closes."""
        execution = self._execution
        if self._resolved is None:
            execution.check_command("ChildHandle.get()")
            row = self._stored()
            if row is None and execution.live:
                row = self._cancel_on_wait()
            while row is None:  # again after each wait the worker's cache continues
                execution.wait_here(f"child {self._child_id!r} has not closed")
                row = self._stored() or self._cancel_on_wait()
            self._resolve(row)
        assert self._resolved is not None
        return execution.runtime.codec.result(
            self._result_fn, decode_outcome(self._resolved, execution)
        )

    def _record_cancelled(self, error: BaseException) -> HistoryRow:
        execution = self._execution
        result = execution.observe(
            Observation(
                execution.seq,
                fill=HistoryRow(self._key, None, CMD_CHILD, EV_CHILD_CANCELLED, error_data(error)),
                cancel_children=((self._child_id, self._key),),
                cancel_reason=f"parent {execution.instance_id} cancelled",
            )
        )
        assert result.stored is not None
        return result.stored

    def cancel(self, ctx: object = None) -> None:
        """Record one cancel command, resolve this handle and request the child's cancel."""
        execution = self._execution
        if self._cancel_issued:
            return
        execution.check_command("ChildHandle.cancel()")
        self._cancel_issued = True
        seq, key = execution.next_position(None, CMD_CHILD_CANCEL, "child_cancel")
        target = {"child_key": self._key, "child_id": self._child_id}
        recorded = execution.history.get(key)
        if recorded is not None:
            # Older records carry no target: they stay readable, unchecked.
            reserved = reservation_of(recorded)
            if reserved and reserved != target:
                raise execution.nondeterminism(
                    f"child_cancel {key!r} recorded the cancel of {reserved}, code cancelled "
                    f"{target}",
                    key=key,
                    expected=json.dumps(reserved),
                    actual=json.dumps(target),
                )
            self._refresh_resolution()
            return
        if execution.readonly:
            raise execution.suspend(f"child_cancel {key!r} is not recorded")
        error = exc.Cancelled(f"child {self._child_id} cancelled by its parent")
        row = execution.history.get(self._key)
        # A handle whose row holds an outcome has nothing to cancel: its child closed, was
        # never created (a cancelled scope, a failed start) or was already asked to cancel.
        never_or_done = row is not None and row.has_value
        execution.observe(
            Observation(
                seq,
                record=HistoryRow(
                    key,
                    seq,
                    CMD_CHILD_CANCEL,
                    EV_CHILD_CANCEL_REQUESTED,
                    json.dumps(None),
                    json.dumps(target),
                    seq,
                ),
                fill_cancelled=((self._key, EV_CHILD_CANCELLED, error_data(error)),),
                cancel_children=() if never_or_done else ((self._child_id, self._key),),
                cancel_reason=f"cancelled by parent {execution.instance_id}",
            )
        )
        self._refresh_resolution()

    def _refresh_resolution(self) -> None:
        row = self._execution.history.get(self._key)
        if row is not None and row.has_value:
            self._resolve(row)
