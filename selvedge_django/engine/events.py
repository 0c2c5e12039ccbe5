"""The history vocabulary: commands, event types, history rows and fences.

Everything the engine and storage say about a recorded history is spelled here:
the ``command`` and ``event_type`` values of a row, the row itself, the lease
fence a writer proves, a signal's delivery positions, and the one way an error
is stored as a row's value (:func:`error_data`). Nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .codec import Codec, error_to_envelope

__all__ = [
    "CLOSE_EVENT_BY_STATUS",
    "CLOSE_KEY",
    "EV_WORKFLOW_CONTINUED",
    "Arrivals",
    "Fence",
    "HistoryRow",
    "SignalPosition",
    "error_data",
    "reservation_of",
]

# Commands (the ``command`` column of a history row).
CMD_ACTIVITY = "activity"
CMD_NOW = "now"
CMD_CLOSE = "close"
CMD_SLEEP = "sleep"
CMD_RECEIVE = "receive"
CMD_AWAIT = "await"
CMD_CHILD = "child"
CMD_CHILD_CANCEL = "child_cancel"
CMD_CANCEL_SCOPE = "cancel_scope"
CMD_PATCH = "patch"
CMD_ATTRIBUTES = "attributes"
CMD_STREAM = "stream"
CMD_STREAM_CLOSE = "stream_close"

# Event types (the ``event_type`` column).
EV_RESERVED = "Reserved"
EV_ACTIVITY_COMPLETED = "ActivityCompleted"
EV_ACTIVITY_FAILED = "ActivityFailed"
EV_ACTIVITY_CANCELLED = "ActivityCancelled"
EV_NOW_RECORDED = "NowRecorded"
EV_TIMER_EXPIRED = "TimerExpired"
EV_TIMER_CANCELLED = "TimerCancelled"
EV_SIGNAL_RECEIVED = "SignalReceived"
EV_SIGNAL_CANCELLED = "SignalCancelled"
EV_SIGNAL_NONE = "SignalNone"
EV_SIGNAL_TIMEOUT = "SignalTimeout"
EV_AWAIT_COMPLETED = "AwaitCompleted"
EV_AWAIT_CANCELLED = "AwaitCancelled"
EV_CHILD_COMPLETED = "ChildCompleted"
EV_CHILD_FAILED = "ChildFailed"
EV_CHILD_CANCELLED = "ChildCancelled"
EV_CHILD_START_FAILED = "ChildStartFailed"
EV_CHILD_CANCEL_REQUESTED = "ChildCancelRequested"
EV_SCOPE_CANCELLED = "ScopeCancelled"
EV_PATCH_MARKER = "PatchMarker"
EV_ATTRIBUTES_SET = "AttributesSet"
EV_STREAM_WRITTEN = "StreamWritten"
EV_STREAM_REJECTED = "StreamRejected"
EV_STREAM_CLOSED = "StreamClosed"
EV_WORKFLOW_COMPLETED = "WorkflowCompleted"
EV_WORKFLOW_FAILED = "WorkflowFailed"
EV_WORKFLOW_CANCELLED = "WorkflowCancelled"
# The close record of a generation that continue-as-new ended (its value: the next input).
EV_WORKFLOW_CONTINUED = "WorkflowContinuedAsNew"

CLOSE_KEY = "$close"

CLOSE_EVENT_BY_STATUS = {
    "completed": EV_WORKFLOW_COMPLETED,
    "failed": EV_WORKFLOW_FAILED,
    "cancelled": EV_WORKFLOW_CANCELLED,
}


@dataclass(frozen=True)
class Fence:
    """One execution's lease token: the writer proves it holds ``epoch``."""

    instance_id: str
    owner: str
    epoch: int


@dataclass(slots=True)
class HistoryRow:
    """One command (or the close record) of an instance's history."""

    key: str
    seq: int | None
    command: str
    event_type: str = EV_RESERVED
    data: str | None = None  # JSON text; None means no value yet
    reservation: str | None = None  # JSON text of immutable command metadata
    delivered_seq: int | None = None

    @property
    def has_value(self) -> bool:
        return self.data is not None


@dataclass(slots=True)
class SignalPosition:
    """Where a signal became visible and where it was consumed (command positions)."""

    id: int
    channel: str
    delivered_seq: int | None = None
    consumed_seq: int | None = None


@dataclass(frozen=True)
class Arrivals:
    """Recorded but undelivered outcomes and signals of an instance."""

    keys: tuple[str, ...] = ()
    signals: tuple[tuple[int, str], ...] = ()


def error_data(error: BaseException, *, codec: Codec | None = None) -> str:
    """Encode an error as a history row's value: its envelope, without a traceback.

    ``codec`` encodes an :class:`~selvedge_django.exceptions.ApplicationError`'s
    details with the project's codec (the default JSON encoder otherwise).

    Every cancellation, timeout and failure outcome that the engine or storage
    records in a row is written through this one helper, so they all read back
    the same way (:func:`~selvedge_django.engine.handles.decode_outcome`).
    """
    return json.dumps(error_to_envelope(error, codec=codec, with_traceback=False))


def reservation_of(row: HistoryRow | None) -> dict[str, Any]:
    """Return a row's reservation (its immutable command metadata) as a dict, or {}."""
    if row is None or not row.reservation:
        return {}
    try:
        data = json.loads(row.reservation)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
