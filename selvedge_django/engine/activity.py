"""What an activity body sees while it runs: its info, heartbeats and cancellation.

An attempt's state lives in a context variable, so ``activity_info()`` and
``heartbeat()`` work from the activity's own code without an argument. A
heartbeat only bumps an in-memory counter (and keeps its details, encoded, in
memory); the worker's renewal tick turns new progress into a claim extension and
stores the latest details with it, for the next attempt's ``heartbeat_details``.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ActivityCancelled, NotActivityContext
from .codec import Codec, encode_progress
from .identifiers import check_stream_key
from .options import ActivityOptions

__all__ = [
    "ActivityInfo",
    "AttemptState",
    "activity_cancelled",
    "activity_info",
    "attempt_scope",
    "heartbeat",
    "write_stream",
]


@dataclass(frozen=True)
class ActivityInfo:
    """Immutable metadata of the current activity attempt.

    ``options`` are the options recorded on the task at reservation: timeouts in
    seconds and the retry policy, without the definition's non-retryable error
    classes (they are never stored). ``heartbeat_details`` are the last details an
    earlier attempt of the task passed to ``heartbeat(details)`` that a claim renewal
    stored (None: none), so a retry can resume where that attempt got to.
    """

    instance_id: str
    workflow_name: str
    activity_id: str
    activity_name: str
    attempt: int
    options: ActivityOptions
    heartbeat_details: Any = None


@dataclass
class AttemptState:
    """Mutable, thread-safe state of one running attempt."""

    info: ActivityInfo
    deadline_monotonic: float | None = None
    progress: int = 0
    # The JSON text of the latest heartbeat details (None: none given by this attempt),
    # encoded with ``codec`` when heartbeat() is called.
    details: str | None = None
    codec: Codec | None = None
    started: float = field(default_factory=time.monotonic)
    cancel_reason: str = ""
    cancelled_at: float | None = None  # monotonic time of cancel()
    # Appends (stream key, JSON text) for this attempt, fenced by its claim, and returns
    # the entry's seq (the worker's store; None: this attempt cannot write streams).
    stream_writer: Callable[[str, str], int] | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self, reason: str) -> None:
        """Mark the attempt as stopped (claim lost, cancelled, shutdown or deadline)."""
        if not self._cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled_at = time.monotonic()
            self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        if (
            not self._cancelled.is_set()
            and self.deadline_monotonic is not None
            and time.monotonic() >= self.deadline_monotonic
        ):
            self.cancel("start_to_close deadline passed")
        return self._cancelled.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for cancellation; return whether it happened."""
        return self._cancelled.wait(timeout)


_current: contextvars.ContextVar[AttemptState | None] = contextvars.ContextVar(
    "selvedge_activity_attempt", default=None
)


@contextmanager
def attempt_scope(state: AttemptState) -> Iterator[AttemptState]:
    """Make ``state`` the current attempt for the duration of the block."""
    token = _current.set(state)
    try:
        yield state
    finally:
        _current.reset(token)


def current_attempt() -> AttemptState | None:
    return _current.get()


def activity_info() -> ActivityInfo | None:
    """Return the current attempt's metadata, or None outside an activity."""
    state = _current.get()
    return state.info if state is not None else None


def heartbeat(details: Any = None) -> None:
    """Record progress for the current attempt (no I/O).

    ``details`` (a JSON value of at most 64 KiB encoded; None keeps the last ones)
    are stored with the worker's next claim renewal, not by this call, and handed
    to the task's next attempt as ``activity_info().heartbeat_details``. A value
    that is not JSON raises TypeError or ValueError, one too large
    :class:`PayloadTooLarge`. Raises :class:`ActivityCancelled` once the attempt has
    lost its claim, been cancelled or passed its deadline, and
    :class:`NotActivityContext` outside an attempt.
    """
    state = _current.get()
    if state is None:
        raise NotActivityContext()
    if state.cancelled:
        raise ActivityCancelled(f"activity attempt stopped: {state.cancel_reason}")
    if details is not None:
        state.details = encode_progress(state.codec or Codec(), details, "heartbeat details")
    state.progress += 1


def write_stream(key: str, value: Any) -> int:
    """Append ``value`` (JSON) to the instance's stream ``key`` now; return its ``seq``.

    Live, in its own short transaction: readers see the entry while the attempt
    still runs. Each entry carries this attempt's number, so the entries of a
    retried attempt follow the old ones and readers can tell them apart. The write
    commits only while the attempt holds its claim (:class:`ActivityCancelled`
    otherwise, like :func:`heartbeat`). ``key`` is 1 to 255 characters
    (``ValueError``); a value that is not JSON raises TypeError or ValueError, one
    over ``MAX_PAYLOAD_BYTES`` :class:`PayloadTooLarge`; a closed stream (or
    instance) raises :class:`StreamClosed` and an instance holding
    ``MAX_STREAM_ENTRIES`` entries :class:`StreamLimitExceeded`; each writes
    nothing. Outside an activity attempt: :class:`NotActivityContext`. Inside a
    ``transactional=True`` activity the entries commit with its outcome instead.
    """
    state = _current.get()
    if state is None or state.stream_writer is None:
        raise NotActivityContext("write_stream() called outside an activity attempt")
    key = check_stream_key(key)
    text = (state.codec or Codec()).encode(value, f"value of stream {key!r}")
    if state.cancelled:
        raise ActivityCancelled(f"activity attempt stopped: {state.cancel_reason}")
    return state.stream_writer(key, text)


def activity_cancelled() -> bool:
    """Return True when the current attempt should stop; False outside an activity."""
    state = _current.get()
    return state is not None and state.cancelled
