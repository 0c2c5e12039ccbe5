"""Signal commands: consume the inbox of an instance (receive and its variants).

``receive`` waits for the oldest signal of a channel, ``receive_with_timeout``
arms a durable timer beside it, ``receive_async`` records the next delivered
signal or that none was there. Like every command, each takes a position and
replays a recorded outcome or writes one fenced step.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from .. import exceptions as exc
from .durations import to_seconds
from .events import (
    CMD_RECEIVE,
    EV_SIGNAL_CANCELLED,
    EV_SIGNAL_NONE,
    EV_SIGNAL_RECEIVED,
    EV_SIGNAL_TIMEOUT,
    HistoryRow,
    error_data,
)
from .execution import Execution
from .handles import decode_outcome
from .identifiers import valid_channel
from .ports import Observation, ReceiveOutcome
from .scope import Scope

__all__ = ["receive", "receive_async", "receive_with_timeout"]


def _check_channel(channel: object) -> str:
    if not valid_channel(channel):
        raise exc.InvalidSignalChannel(
            f"signal channel must contain 1 to 255 UTF-8 bytes, not {channel!r}"
        )
    return str(channel)


def _signal_outcome(execution: Execution, row: HistoryRow) -> Any:
    if row.event_type == EV_SIGNAL_RECEIVED:
        return execution.decode_stored(row.data)
    if row.event_type == EV_SIGNAL_TIMEOUT:
        raise exc.ReceiveTimeout(f"no signal before the timeout ({row.key})")
    return decode_outcome(row, execution)


def receive(execution: Execution, scope: Scope, channel: str) -> Any:
    """Consume the oldest signal of ``channel``; cancellation is observed first."""
    execution.check_command()
    channel = _check_channel(channel)
    seq, key = execution.next_position(None, CMD_RECEIVE, f"receive:{channel}")
    recorded = execution.history.get(key)
    if recorded is not None and recorded.has_value:
        return _signal_outcome(execution, recorded)
    if execution.readonly:
        raise execution.suspend(f"receive {key!r} is not recorded")
    store = execution.runtime.store
    while True:  # again after each wait the worker's cache continues (Execution.wait_here)
        cancelled: BaseException | None = None
        if scope.locally_cancelled():
            cancelled = exc.ScopeCancelled()
        else:
            # The store's one write: the cancel state, the signal and the observation.
            outcome = _receive_next(execution, seq, key, channel, scope.attached())
            if outcome is None:  # not offered: read both, then observe
                cancelled = execution.cancellation(scope)
                if cancelled is None:
                    message = execution.guarded(
                        lambda: store.next_signal(execution.instance_id, channel)
                    )
                    if message is not None:
                        break
            elif outcome.cancel_reason is not None:
                cancelled = exc.WorkflowCancelled(execution.instance_id, outcome.cancel_reason)
            elif outcome.message is not None:
                _signal_received(execution, key)
                return execution.decode_stored(outcome.message.payload)
        if cancelled is not None:
            execution.observe(
                Observation(
                    seq,
                    record=HistoryRow(
                        key, seq, CMD_RECEIVE, EV_SIGNAL_CANCELLED, error_data(cancelled)
                    ),
                    deliver_all=True,
                )
            )
            raise cancelled
        execution.wait_here(f"no signal on {channel!r}")
    execution.observe(
        Observation(
            seq,
            record=HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, message.payload),
            consume=message.id,
            deliver_all=True,
        )
    )
    _signal_received(execution, key)
    return execution.decode_stored(message.payload)


def _receive_next(
    execution: Execution, seq: int, key: str, channel: str, uncancelled: bool
) -> ReceiveOutcome | None:
    """The store's one-write receive (None: not offered here), folded into the view."""
    fence = execution.fence
    assert fence is not None
    store = execution.runtime.store
    outcome: ReceiveOutcome | None = execution.guarded(
        lambda: store.receive_next(fence, seq, key, channel, uncancelled)
    )
    if outcome is not None and outcome.message is not None and outcome.result is not None:
        message = outcome.message
        observation = Observation(
            seq,
            record=HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, message.payload),
            consume=message.id,
            deliver_all=True,
        )
        execution.fold(observation, outcome.result)
    return outcome


def _signal_received(execution: Execution, key: str) -> None:
    execution.runtime.fire(
        "on_signal_received",
        instance_id=execution.instance_id,
        workflow_name=execution.workflow_name,
        key=key,
    )


def receive_with_timeout(
    execution: Execution, scope: Scope, channel: str, timeout: float | timedelta
) -> Any:
    """Receive with a durable timer: cancellation, then a signal, then the timer."""
    execution.check_command()
    channel = _check_channel(channel)
    seconds = to_seconds(timeout, "receive timeout", allow_nonpositive=True)
    seq, key = execution.next_position(None, CMD_RECEIVE, f"receive:{channel}")
    recorded = execution.history.get(key)
    if recorded is not None and recorded.has_value:
        return _signal_outcome(execution, recorded)
    if execution.readonly:
        raise execution.suspend(f"receive {key!r} is not recorded")
    fence = execution.fence
    assert fence is not None
    store = execution.runtime.store
    if recorded is None:
        if seconds <= 0:
            execution.record(HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_TIMEOUT, json.dumps(None)))
            raise exc.ReceiveTimeout(f"receive on {channel!r} timed out at once")
        if scope.locally_cancelled():
            error = exc.ScopeCancelled()
            execution.observe(
                Observation(
                    seq,
                    record=HistoryRow(
                        key, seq, CMD_RECEIVE, EV_SIGNAL_CANCELLED, error_data(error)
                    ),
                    deliver_all=True,
                )
            )
            raise error
        expires = execution.time_base() + timedelta(seconds=seconds)
        row = HistoryRow(
            key, seq, CMD_RECEIVE, reservation=json.dumps({"expires_at": expires.isoformat()})
        )
        stored = execution.guarded(lambda: store.reserve_timer(fence, row, expires, seconds))
        execution.check_stored(key, stored, CMD_RECEIVE)
    while True:  # again after each wait the worker's cache continues (Execution.wait_here)
        cancelled = execution.cancellation(scope)
        if cancelled is not None:
            _fill(execution, seq, key, EV_SIGNAL_CANCELLED, error_data(cancelled))
            raise cancelled
        message = execution.guarded(lambda: store.next_signal(execution.instance_id, channel))
        if message is not None:
            result = execution.observe(
                Observation(
                    seq,
                    fill=HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, message.payload),
                    consume=message.id,
                    retire_timer=key,
                    deliver_all=True,
                )
            )
            assert result.stored is not None
            if result.stored.event_type == EV_SIGNAL_RECEIVED:
                _signal_received(execution, key)
            return _signal_outcome(execution, result.stored)
        if execution.guarded(lambda: store.timer_fired(execution.instance_id, key)):
            stored_row = _fill(execution, seq, key, EV_SIGNAL_TIMEOUT, json.dumps(None))
            return _signal_outcome(execution, stored_row)
        execution.wait_here(f"no signal on {channel!r} yet")


def _fill(execution: Execution, seq: int, key: str, event_type: str, data: str) -> HistoryRow:
    result = execution.observe(
        Observation(
            seq,
            fill=HistoryRow(key, seq, CMD_RECEIVE, event_type, data),
            retire_timer=key,
            deliver_all=True,
        )
    )
    assert result.stored is not None
    if result.stored.event_type != event_type:
        return result.stored
    if event_type == EV_SIGNAL_CANCELLED:
        return result.stored
    return result.stored


def receive_async(execution: Execution, channel: str) -> tuple[Any, bool]:
    """Record the next delivered signal of ``channel``, or that none was available."""
    execution.check_command()
    channel = _check_channel(channel)
    seq, key = execution.next_position(None, CMD_RECEIVE, f"receive:{channel}")
    recorded = execution.history.get(key)
    if recorded is not None and recorded.has_value:
        if recorded.event_type == EV_SIGNAL_NONE:
            return None, False
        return _signal_outcome(execution, recorded), True
    if execution.readonly:
        raise execution.suspend(f"receive {key!r} is not recorded")
    position = execution.oldest_pending(channel)
    if position is None:
        execution.record(HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_NONE, json.dumps(None)))
        return None, False
    store = execution.runtime.store
    payload = execution.guarded(lambda: store.signal_payload(position.id))
    execution.observe(
        Observation(
            seq,
            record=HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, payload),
            consume=position.id,
        )
    )
    _signal_received(execution, key)
    return execution.decode_stored(payload), True
