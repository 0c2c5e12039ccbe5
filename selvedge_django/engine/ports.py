"""What the replay engine needs from storage and from the process that runs it.

:class:`EngineStore` is the store Protocol: durable operations, one transaction
each. The ORM store is the real implementation; the read-only replay
(:mod:`.replay`) has one that is never reached. Every method that writes on
behalf of an execution takes the execution's :class:`~.events.Fence` and commits
only when that fence is still the instance's current lease (otherwise it raises
:class:`~selvedge_django.exceptions.Fenced` and writes nothing).

:class:`Runtime` is what an execution needs from its process: the store, the
codec, the clock, inline activity attempts and hooks. The records here are the
requests and answers passed through both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .attributes import AttributeValue
from .codec import Codec
from .events import Arrivals, Fence, HistoryRow, SignalPosition

__all__ = [
    "ChildSpec",
    "ClaimedTask",
    "CloseRequest",
    "EngineStore",
    "ExecutionOutcome",
    "ExecutionSnapshot",
    "HistoryLimits",
    "Observation",
    "ObservationResult",
    "ReceiveOutcome",
    "Runtime",
    "SignalMessage",
    "TaskClaim",
    "TaskSpec",
]


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
    # Where the previous execution parked (a wait that records nothing): its command
    # position and key, 0 and "" when it parked nowhere (see engine.patches).
    parked_seq: int = 0
    parked_key: str = ""
    # The generation the current history began with: 1, or the one a continue-as-new
    # opened. Default child ids of a later history include it.
    history_generation: int = 1


@dataclass(frozen=True)
class SignalMessage:
    """One pending inbox entry, with its payload (JSON text)."""

    id: int
    channel: str
    payload: str


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
class ReceiveOutcome:
    """What a one-statement receive found (:meth:`WorkflowStore.receive_next`).

    ``cancel_reason`` set: a cancel request comes first and nothing was consumed;
    ``message`` and ``result`` set: the signal was consumed and its row recorded,
    with the delivery batch in ``result``; neither: no signal yet, nothing written.
    """

    message: SignalMessage | None = None
    result: ObservationResult | None = None
    cancel_reason: str | None = None


@dataclass(frozen=True)
class ChildSpec:
    """A child instance to create together with the parent's command."""

    instance_id: str
    workflow_name: str
    input: Any
    # The child's own execution timeout (ms; None: none), counted from its start.
    execution_timeout_ms: int | None = None
    # The parent's history generation (see ExecutionSnapshot.history_generation).
    parent_generation: int = 1


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
    priority: int = 0
    # (key, max_concurrency): claims keep the running attempts of the key within it.
    concurrency: tuple[str, int] | None = None


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
    # The monotonic time just before the statement that took the claim: the database
    # measures the attempt's deadline from a moment after it, so a deadline measured
    # from here never passes later on this worker than in the database.
    claimed_at: float | None = None
    # The JSON text of the last heartbeat details stored for the task (None: none).
    heartbeat_details: str | None = None
    # For the metrics: the task's queue, how long it was due before this claim
    # (database clock, ms; 0 for a claim taken with its reservation), and whether the
    # claim took over a lapsed one.
    queue: str = ""
    waited_ms: int | None = None
    taken_over: bool = False


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


@dataclass
class ExecutionOutcome:
    """How an execution ended: closed, suspended or abandoned.

    ``workflow_error`` is what the workflow code itself raised when ``error`` is
    a divergence found after it (recorded commands the code stopped before).
    """

    # "completed" | "failed" | "cancelled" | "suspended" | "abandoned" | "continued"
    # ("continued": ``output`` is the JSON text of the next generation's input)
    kind: str
    output: Any = None
    error: BaseException | None = None
    workflow_error: BaseException | None = None


@dataclass(frozen=True)
class HistoryLimits:
    """The most an instance's history may hold: command rows, and bytes of stored values.

    A runtime that has limits exposes them as ``history_limits``; an execution
    then fails with :class:`HistoryLimitExceeded` instead of issuing a command
    once its history has reached either one.
    """

    events: int
    bytes: int


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

    def release_lease(
        self, fence: Fence, runnable: bool = False, parked: tuple[int, str] | None = None
    ) -> None:
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

    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        """Receive ``channel``'s oldest unconsumed signal at ``seq`` in one write.

        Reads the cancel state (when ``uncancelled``, a cancel request wins over a
        pending signal) and the signal, consumes it, records ``key``'s row and
        delivers every arrival, as one statement. None when the store does not offer
        it here: the caller reads the cancel state and the signal, then observes.
        """
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

    def set_progress(self, fence: Fence, progress: str) -> None:
        """Store the instance's progress (JSON text), fenced, in one statement."""
        ...

    def set_attributes(
        self, fence: Fence, row: HistoryRow, attributes: Mapping[str, AttributeValue | None]
    ) -> HistoryRow:
        """Record a ``set_attributes`` command and change the attribute rows, fenced, in
        one transaction (``None`` removes a name)."""
        ...

    def write_stream(self, fence: Fence, row: HistoryRow, key: str, value: str) -> HistoryRow:
        """Append ``value`` (JSON text) to stream ``key`` with the command's row, fenced.

        The stored row holds the entry's seq, or the refusal (a closed stream, an
        instance at its entry limit) that the command raises live and in replay.
        """
        ...

    def close_stream(self, fence: Fence, row: HistoryRow, key: str) -> HistoryRow:
        """Close stream ``key`` with the command's row, fenced."""
        ...


class Runtime(Protocol):
    """What an execution needs from the process that runs it."""

    @property
    def store(self) -> EngineStore: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def worker_id(self) -> str: ...

    def clock(self) -> datetime: ...

    def lease_valid(self, fence: Fence) -> bool: ...

    def can_run_inline(self, activity_name: str, queue: str) -> bool: ...

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None: ...

    def tasks_reserved(self) -> None: ...

    def fire(self, hook: str, **fields: Any) -> None: ...
