"""What the replay engine needs from storage: durable operations, one transaction each.

The ORM store (:mod:`selvedge_django.store`) is the real implementation; the
read-only replay used by queries and replay checks has its own. Every method
that writes on behalf of an execution takes the execution's :class:`Fence` and
commits only when that fence is still the instance's current lease (otherwise it
raises :class:`~selvedge_django.exceptions.Fenced` and writes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ClaimedTask",
    "CloseRequest",
    "EngineStore",
    "ExecutionSnapshot",
    "Fence",
    "HistoryRow",
    "TaskClaim",
    "TaskSpec",
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
EV_WORKFLOW_COMPLETED = "WorkflowCompleted"
EV_WORKFLOW_FAILED = "WorkflowFailed"
EV_WORKFLOW_CANCELLED = "WorkflowCancelled"

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


@dataclass
class ExecutionSnapshot:
    """Everything one execution reads before running workflow code."""

    instance_id: str
    workflow_name: str
    input: Any
    status: str
    cancel_requested: bool = False
    cancel_reason: str = ""
    parent_instance_id: str = ""
    parent_key: str = ""
    history: list[HistoryRow] = field(default_factory=list)
    signals: list[SignalPosition] = field(default_factory=list)


@dataclass(slots=True)
class SignalPosition:
    """Where a signal became visible and where it was consumed (command positions)."""

    id: int
    channel: str
    delivered_seq: int | None = None
    consumed_seq: int | None = None


@dataclass(frozen=True)
class SignalMessage:
    """One pending inbox entry, with its payload (JSON text)."""

    id: int
    channel: str
    payload: str


@dataclass(frozen=True)
class Arrivals:
    """Recorded but undelivered outcomes and signals of an instance."""

    keys: tuple[str, ...] = ()
    signals: tuple[tuple[int, str], ...] = ()


@dataclass
class Observation:
    """One fenced observation commit: record or fill a value and deliver a batch.

    ``record`` inserts a new command row; ``fill`` sets the value of an existing
    reserved row if it has none (a stored value wins and is returned instead).
    ``deliver_all`` delivers every arrival at commit time; otherwise ``deliver``
    names exactly the arrivals to deliver. ``consume`` consumes one signal,
    ``retire_timer`` deletes a timer subscription, ``cancel_tasks`` cancels
    unfinished tasks, ``fill_cancelled`` fills the given reserved rows with a
    cancellation outcome, ``cancel_children`` requests cancellation of children,
    each named by (child id, the parent's key that started it): only an instance
    this parent started at that key is asked, never another one with that id.
    """

    seq: int
    record: HistoryRow | None = None
    fill: HistoryRow | None = None
    deliver_all: bool = False
    deliver: Arrivals | None = None
    consume: int | None = None
    retire_timer: str | None = None
    cancel_tasks: tuple[str, ...] = ()
    fill_cancelled: tuple[tuple[str, str, str], ...] = ()  # (key, event_type, data)
    cancel_children: tuple[tuple[str, str], ...] = ()  # (child id, parent key)
    cancel_reason: str = ""


@dataclass
class ObservationResult:
    """The stored row and what the commit delivered."""

    stored: HistoryRow | None
    delivered: Arrivals
    consumed: bool = True


@dataclass(frozen=True)
class ChildSpec:
    """A child instance to create together with the parent's command."""

    instance_id: str
    workflow_name: str
    input: Any


@dataclass(frozen=True)
class TaskSpec:
    """A durable activity task to create together with its history reservation."""

    name: str
    workflow_name: str
    input: str
    queue: str
    options: dict[str, Any]
    max_attempts: int
    schedule_to_start_timeout: float | None
    start_to_close_timeout: float | None
    heartbeat_timeout: float | None


@dataclass(frozen=True)
class TaskClaim:
    """One attempt's ownership token on a task: (owner, epoch)."""

    task_id: int
    instance_id: str
    key: str
    owner: str
    epoch: int


@dataclass
class ClaimedTask:
    """A task whose claim was acquired and read back in full."""

    claim: TaskClaim
    name: str
    workflow_name: str
    input: str
    options: dict[str, Any]
    attempt: int
    failures: int
    max_attempts: int
    claim_ttl: float
    start_to_close_timeout: float | None
    heartbeat_timeout: float | None
    attempt_deadline_ms: int | None = None


@dataclass(frozen=True)
class CloseRequest:
    """A workflow close: status, output or error, and what the close must clean up.

    ``unfinished`` says whether any command may still have a task, timer or
    missing value; ``children`` whether the history started children; ``parent``
    is (parent id, parent key) of a child instance, ("", "") for a top-level one.
    """

    status: str
    output: str | None
    error: str | None
    unfinished: bool = True
    children: bool = True
    parent: tuple[str, str] | None = None


class EngineStore(Protocol):
    """The durable operations the replay engine performs."""

    def record_command(self, fence: Fence, row: HistoryRow) -> HistoryRow:
        """Insert a command (with or without value); return the first stored row."""
        ...

    def reserve_activity(
        self,
        fence: Fence,
        row: HistoryRow,
        task: TaskSpec,
        claim_owner: str | None,
        *,
        release: bool = False,
        observe_cancel: bool = False,
    ) -> tuple[HistoryRow, ClaimedTask | None]:
        """Reserve the command and create its task; claim it for ``claim_owner`` if given.

        ``release`` also releases the lease in the same write (the execution is about
        to suspend on this task), keeping the instance runnable if input arrived.
        ``observe_cancel`` takes the claim only while no cancel request is recorded;
        after one, the row is stored with the ``WorkflowCancelled`` outcome (returned),
        the task is cancelled and nothing is claimed.
        """
        ...

    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        """Claim an existing task inline if it is claimable by this worker."""
        ...

    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        """Read one history row."""
        ...

    def close(self, fence: Fence, request: CloseRequest) -> str:
        """Close the instance, fenced, in one transaction; return the status written."""
        ...

    def release_lease(self, fence: Fence, runnable: bool = False) -> None:
        """Release the lease; ``runnable`` asks for another dispatch."""
        ...

    def now_ms(self) -> int:
        """Return the store clock in Unix milliseconds."""
        ...

    def reserve_timer(
        self, fence: Fence, row: HistoryRow, expires_at: Any, delay: float
    ) -> HistoryRow:
        """Reserve a sleep (or timed receive) and arm its timer, atomically.

        ``expires_at`` is workflow time (the configured clock, never below the time
        floor): the value the fire records. ``delay`` is the timer's duration from the
        base its expiry was computed from; the timer fires once that much has passed
        on the store clock from now, whatever the configured clock says.
        """
        ...

    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        """Commit one observation and its delivery batch under the fence."""
        ...

    def next_signal(self, instance_id: str, channel: str) -> SignalMessage | None:
        """Return the oldest unconsumed signal of the channel."""
        ...

    def signal_payload(self, signal_id: int) -> str | None:
        """Return a signal's payload."""
        ...

    def arrivals(self, instance_id: str) -> Arrivals:
        """Return recorded outcomes and signals not yet delivered."""
        ...

    def cancel_state(self, instance_id: str) -> tuple[bool, str]:
        """Return (cancel requested, reason)."""
        ...

    def timer_fired(self, instance_id: str, key: str) -> bool:
        """True when the timer of a timed receive has fired."""
        ...

    def start_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow:
        """Reserve the parent's command and create the child in one transaction."""
        ...
