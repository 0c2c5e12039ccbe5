"""The replay engine: one execution of workflow code against its recorded history.

An execution runs the workflow function on the calling thread, from the start.
Each command takes the next command position and a history key; when the key is
recorded the command returns the recorded value (replay), otherwise it writes
through the store under the execution's fence (live). A wait that cannot
complete raises :class:`Suspend`, a ``BaseException`` that unwinds the user's
frames (``finally`` blocks run) and makes the dispatcher release the lease; a
later dispatch replays from the start.

Nothing here imports Django: the runtime hands the execution its store, codec,
clock and activity runner.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from .. import exceptions as exc
from .codec import Codec, error_from_envelope, error_to_envelope
from .store import (
    CMD_ACTIVITY,
    CMD_NOW,
    EV_ACTIVITY_CANCELLED,
    EV_ACTIVITY_COMPLETED,
    EV_NOW_RECORDED,
    ClaimedTask,
    CloseRequest,
    EngineStore,
    ExecutionSnapshot,
    Fence,
    HistoryRow,
    TaskSpec,
)

if TYPE_CHECKING:
    from .options import ActivityOptions

__all__ = [
    "Execution",
    "ExecutionOutcome",
    "Future",
    "Runtime",
    "Suspend",
    "WorkflowContext",
    "current_execution",
]

logger = logging.getLogger("selvedge_django.engine")

RESERVED_KEY_PREFIXES = ("$", "#")


class Suspend(BaseException):  # noqa: N818 - control flow, not an error
    """Unwinds workflow code when a wait cannot complete. Never catch it."""


class Frontier(Suspend):
    """A read-only replay reached the first unrecorded command."""


class ActivityLike(Protocol):
    name: str
    options: ActivityOptions


class Runtime(Protocol):
    """What an execution needs from the process that runs it."""

    store: EngineStore
    codec: Codec
    worker_id: str

    def clock(self) -> datetime: ...

    def lease_valid(self, fence: Fence) -> bool: ...

    def can_run_inline(self, activity_name: str, queue: str) -> bool: ...

    def run_attempt(self, task: ClaimedTask) -> None: ...

    def tasks_reserved(self) -> None: ...

    def fire(self, hook: str, **fields: Any) -> None: ...


_local = threading.local()


def current_execution() -> Execution | None:
    """Return the execution running on this thread, if any."""
    return getattr(_local, "execution", None)


@dataclass
class ExecutionOutcome:
    """How an execution ended: closed, suspended or abandoned."""

    kind: str  # "completed" | "failed" | "cancelled" | "suspended" | "abandoned"
    output: Any = None
    error: BaseException | None = None


class Execution:
    """One run of workflow code against recorded history, under one lease."""

    def __init__(
        self,
        runtime: Runtime,
        snapshot: ExecutionSnapshot,
        fence: Fence | None,
        *,
        readonly: bool = False,
    ) -> None:
        self.runtime = runtime
        self.snapshot = snapshot
        self.fence = fence
        self.readonly = readonly or fence is None
        self.instance_id = snapshot.instance_id
        self.workflow_name = snapshot.workflow_name
        self.history: dict[str, HistoryRow] = {}
        self.by_seq: dict[int, HistoryRow] = {}
        for row in snapshot.history:
            self.history[row.key] = row
            if row.seq is not None:
                self.by_seq[row.seq] = row
        self.max_recorded_seq = max(self.by_seq, default=0)
        self.seq = 0
        self.used_keys: set[str] = set()
        self.thread_id: int | None = None
        self.fatal: BaseException | None = None
        self.suspension: Suspend | None = None
        self.in_activity = False
        self.time_floor: datetime | None = None
        self.query_handlers: dict[str, Callable[[], Any]] = {}
        self.context = WorkflowContext(self)

    # -- state ------------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        return self.seq < self.max_recorded_seq

    def _fail(self, error: BaseException) -> BaseException:
        """Make ``error`` sticky: the execution ends with it whatever user code does."""
        if self.fatal is None:
            self.fatal = error
        return self.fatal

    def check_command(self) -> None:
        """Reject commands from foreign threads, activities, unwinding or a failed run."""
        if self.thread_id is not None and threading.get_ident() != self.thread_id:
            raise self._fail(
                exc.NondeterminismError(
                    "workflow command issued from a thread that is not the workflow's",
                    instance_id=self.instance_id,
                )
            )
        if self.fatal is not None:
            raise self.fatal
        if self.suspension is not None:
            raise self.suspension
        if self.in_activity:
            raise self._fail(
                exc.NondeterminismError(
                    "workflow command issued inside an activity", instance_id=self.instance_id
                )
            )

    def suspend(self, why: str) -> Suspend:
        """Return the suspension to raise; later commands are rejected without writes."""
        self.suspension = Frontier(why) if self.readonly else Suspend(why)
        return self.suspension

    def next_position(self, key: str | None, command: str, label: str) -> tuple[int, str]:
        """Take the next command position and validate its key against history."""
        self.seq += 1
        seq = self.seq
        if key is None:
            key = f"#{seq}:{label}"[:255]
        recorded_at_seq = self.by_seq.get(seq)
        if recorded_at_seq is not None and recorded_at_seq.key != key:
            raise self._fail(
                exc.NondeterminismError(
                    f"command {seq} is {command} {key!r} but history recorded "
                    f"{recorded_at_seq.command} {recorded_at_seq.key!r}",
                    instance_id=self.instance_id,
                    key=recorded_at_seq.key,
                    expected=recorded_at_seq.command,
                    actual=command,
                )
            )
        recorded = self.history.get(key)
        if recorded is not None and recorded.seq != seq:
            raise self._fail(
                exc.NondeterminismError(
                    f"key {key!r} was recorded at position {recorded.seq}, reached at {seq}",
                    instance_id=self.instance_id,
                    key=key,
                    expected=recorded.command,
                    actual=command,
                )
            )
        if recorded is not None and recorded.command != command:
            raise self._fail(
                exc.NondeterminismError(
                    f"key {key!r} recorded {recorded.command}, code issued {command}",
                    instance_id=self.instance_id,
                    key=key,
                    expected=recorded.command,
                    actual=command,
                )
            )
        self.used_keys.add(key)
        return seq, key

    def validate_user_key(self, key: str, what: str) -> str:
        if not isinstance(key, str) or not key or len(key) > 255:
            raise exc.HistoryKeyConflict(f"{what} must be a string of 1 to 255 characters")
        if key.startswith(RESERVED_KEY_PREFIXES):
            raise exc.HistoryKeyConflict(f"{what} {key!r} uses a reserved prefix ($ or #)")
        if key in self.used_keys or (key in self.history and key in self.used_keys):
            raise exc.HistoryKeyConflict(f"{what} {key!r} is already used by this execution")
        return key

    def guarded(self, op: Callable[[], Any]) -> Any:
        """Run a store write: lease belief checked first, store failures made sticky."""
        assert self.fence is not None
        if not self.runtime.lease_valid(self.fence):
            raise self._fail(exc.LeaseLost(f"lease on {self.instance_id!r} can no longer be proven"))
        try:
            return op()
        except (exc.Fenced, exc.LeaseLost) as error:
            raise self._fail(error)
        except exc.HistoryKeyConflict as error:
            raise self._fail(error)
        except Exception as error:
            # A storage failure: the run cannot know what was written. Stop here; the
            # instance is redispatched and replays.
            raise self._fail(error)

    def store_conflict(self, key: str, stored: HistoryRow, command: str) -> None:
        if stored.command != command:
            raise self._fail(
                exc.NondeterminismError(
                    f"key {key!r} holds {stored.command}, code issued {command}",
                    instance_id=self.instance_id,
                    key=key,
                    expected=stored.command,
                    actual=command,
                )
            )

    # -- commands ---------------------------------------------------------------------

    def issue_activity(
        self,
        activity: ActivityLike,
        input: Any,
        options: ActivityOptions | None,
        activity_id: str | None,
        *,
        inline: bool,
    ) -> Future:
        self.check_command()
        resolved = activity.options.merged(options)
        if activity_id is not None:
            self.validate_user_key(activity_id, "activity_id")
        seq, key = self.next_position(activity_id, CMD_ACTIVITY, activity.name)
        recorded = self.history.get(key)
        if recorded is not None:
            reserved_name = _reservation(recorded).get("name")
            if reserved_name is not None and reserved_name != activity.name:
                raise self._fail(
                    exc.NondeterminismError(
                        f"key {key!r} recorded activity {reserved_name!r}, "
                        f"code issued {activity.name!r}",
                        instance_id=self.instance_id,
                        key=key,
                        expected=str(reserved_name),
                        actual=activity.name,
                    )
                )
            return Future(self, key, activity.name, inline=inline)
        if self.readonly:
            raise self.suspend(f"activity {key!r} is not recorded")
        try:
            input_text = self.runtime.codec.encode(input, f"input of activity {activity.name!r}")
        except (TypeError, ValueError) as error:
            # Nothing was written; the same input fails the same way on replay.
            self.seq -= 1
            self.used_keys.discard(key)
            raise TypeError(f"activity {activity.name!r} input is not JSON: {error}") from error
        policy = resolved.effective_retry_policy()
        spec = TaskSpec(
            name=activity.name,
            workflow_name=self.workflow_name,
            input=input_text,
            queue=resolved.queue,
            options=resolved.to_json(),
            max_attempts=policy.max_attempts,
            schedule_to_start_timeout=_f(resolved.schedule_to_start_timeout),
            start_to_close_timeout=_f(resolved.start_to_close_timeout),
            heartbeat_timeout=_f(resolved.heartbeat_timeout),
        )
        row = HistoryRow(
            key=key,
            seq=seq,
            command=CMD_ACTIVITY,
            reservation=json.dumps({"name": activity.name, "queue": resolved.queue}),
        )
        claim_owner = (
            self.runtime.worker_id
            if inline and self.runtime.can_run_inline(activity.name, resolved.queue)
            else None
        )
        assert self.fence is not None
        fence = self.fence
        stored, claimed = self.guarded(
            lambda: self.runtime.store.reserve_activity(fence, row, spec, claim_owner)
        )
        self.store_conflict(key, stored, CMD_ACTIVITY)
        self.history[key] = stored
        if claimed is None:
            self.runtime.tasks_reserved()
        future = Future(self, key, activity.name, inline=inline)
        future._claimed = claimed
        return future

    def run_inline(self, task: ClaimedTask) -> None:
        """Run one claimed attempt on the workflow thread."""
        self.in_activity = True
        try:
            self.runtime.run_attempt(task)
        finally:
            self.in_activity = False

    def now(self) -> datetime:
        self.check_command()
        seq, key = self.next_position(None, CMD_NOW, "now")
        recorded = self.history.get(key)
        if recorded is not None and recorded.data is not None:
            value = _parse_time(json.loads(recorded.data))
            self.advance_floor(value)
            return value
        if self.readonly:
            raise self.suspend("now() is not recorded")
        live = self.runtime.clock().astimezone(UTC)
        if self.time_floor is not None and live < self.time_floor:
            live = self.time_floor
        row = HistoryRow(
            key=key,
            seq=seq,
            command=CMD_NOW,
            event_type=EV_NOW_RECORDED,
            data=json.dumps(live.isoformat()),
        )
        assert self.fence is not None
        fence = self.fence
        stored = self.guarded(lambda: self.runtime.store.record_command(fence, row))
        self.store_conflict(key, stored, CMD_NOW)
        self.history[key] = stored
        value = _parse_time(json.loads(stored.data or json.dumps(live.isoformat())))
        self.advance_floor(value)
        return value

    def advance_floor(self, value: datetime) -> None:
        if self.time_floor is None or value > self.time_floor:
            self.time_floor = value

    # -- running ----------------------------------------------------------------------

    def run(self, fn: Callable[[WorkflowContext, Any], Any]) -> ExecutionOutcome:
        """Run the workflow function once and classify how it ended (no close written)."""
        self.thread_id = threading.get_ident()
        previous = getattr(_local, "execution", None)
        _local.execution = self
        try:
            try:
                output = fn(self.context, self.snapshot.input)
            except Suspend:
                return self._after_suspension()
            except exc.Cancelled as error:
                if self.suspension is not None:
                    return self._after_suspension()
                return self._classify_error(error)
            except BaseException as error:  # noqa: BLE001 - workflow code may raise anything
                if self.suspension is not None:
                    return self._after_suspension()
                return self._classify_error(error)
            if self.suspension is not None and self.fatal is None:
                self._fail(
                    exc.NondeterminismError(
                        "workflow code swallowed a suspension (except BaseException?)",
                        instance_id=self.instance_id,
                    )
                )
            if self.fatal is not None:
                return self._fatal_outcome()
            leftover = [row for seq, row in self.by_seq.items() if seq > self.seq]
            if leftover:
                first = min(leftover, key=lambda r: r.seq or 0)
                self._fail(
                    exc.NondeterminismError(
                        f"workflow returned before recorded command {first.seq} "
                        f"({first.command} {first.key!r})",
                        instance_id=self.instance_id,
                        key=first.key,
                        expected=first.command,
                        actual="return",
                    )
                )
                return self._fatal_outcome()
            return ExecutionOutcome("completed", output=output)
        finally:
            _local.execution = previous

    def _after_suspension(self) -> ExecutionOutcome:
        if self.fatal is not None:
            return self._fatal_outcome()
        return ExecutionOutcome("suspended")

    def _classify_error(self, error: BaseException) -> ExecutionOutcome:
        if self.fatal is not None:
            return self._fatal_outcome()
        if isinstance(error, exc.Cancelled):
            return ExecutionOutcome("cancelled", error=error)
        return ExecutionOutcome("failed", error=error)

    def _fatal_outcome(self) -> ExecutionOutcome:
        fatal = self.fatal
        assert fatal is not None
        if isinstance(fatal, exc.NondeterminismError | exc.HistoryKeyConflict):
            return ExecutionOutcome("failed", error=fatal)
        return ExecutionOutcome("abandoned", error=fatal)

    def close_request(self, outcome: ExecutionOutcome) -> CloseRequest:
        """Encode a closing outcome; an unencodable output fails the workflow instead."""
        codec = self.runtime.codec
        if outcome.kind == "completed":
            try:
                text = codec.encode(outcome.output, "workflow output")
            except (TypeError, ValueError) as error:
                outcome.kind = "failed"
                outcome.error = exc.ApplicationError(
                    f"workflow output is not JSON: {error}", type="OutputEncodingError"
                )
            else:
                return CloseRequest("completed", text, None)
        assert outcome.error is not None
        envelope = json.dumps(error_to_envelope(outcome.error, codec=codec))
        return CloseRequest(outcome.kind, None, envelope)


class WorkflowContext:
    """The handle workflow code uses to issue durable commands."""

    def __init__(self, execution: Execution) -> None:
        self._execution = execution

    @property
    def instance_id(self) -> str:
        return self._execution.instance_id

    @property
    def workflow_name(self) -> str:
        return self._execution.workflow_name

    @property
    def worker_id(self) -> str:
        return self._execution.runtime.worker_id

    @property
    def is_replaying(self) -> bool:
        """True while the execution re-issues commands that history already records."""
        return self._execution.is_replaying

    def history_event(self, key: str) -> HistoryRow | None:
        """Return a copy of the recorded history row at ``key`` (read-only diagnostics)."""
        row = self._execution.history.get(key)
        if row is None:
            return None
        return HistoryRow(**row.__dict__)

    def now(self) -> datetime:
        """Return workflow time (aware UTC), recorded once per live call."""
        return self._execution.now()

    def set_query_handler(self, name: str, handler: Callable[[], Any] | None) -> None:
        """Register (or with None remove) a zero-argument query handler."""
        if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= 255:
            raise ValueError("query names contain 1 to 255 bytes")
        if handler is None:
            self._execution.query_handlers.pop(name, None)
        else:
            self._execution.query_handlers[name] = handler


class Future:
    """An activity outcome tied to the execution that issued it."""

    def __init__(self, execution: Execution, key: str, activity_name: str, *, inline: bool) -> None:
        self._execution = execution
        self._key = key
        self._activity_name = activity_name
        self._inline = inline
        self._claimed: ClaimedTask | None = None
        self._resolved: HistoryRow | None = None

    @property
    def key(self) -> str:
        """The history key assigned when the activity was issued."""
        return self._key

    def __repr__(self) -> str:
        return f"<Future {self._key!r} ready={self.is_ready()}>"

    def is_ready(self) -> bool:
        """True when the outcome was delivered or a get() already returned it."""
        if self._resolved is not None:
            return True
        row = self._execution.history.get(self._key)
        return (
            row is not None
            and row.has_value
            and row.delivered_seq is not None
            and row.delivered_seq <= self._execution.seq
        )

    def get(self, ctx: WorkflowContext | None = None) -> Any:
        """Return the activity's result, raise its error, or suspend until it exists."""
        execution = self._execution
        if self._resolved is None:
            execution.check_command()
            row = self._lookup()
            if row is None:
                raise execution.suspend(f"activity {self._key!r} has no outcome yet")
            self._resolved = row
        return self._outcome(self._resolved)

    def _lookup(self) -> HistoryRow | None:
        execution = self._execution
        row = execution.history.get(self._key)
        if row is not None and row.has_value:
            return row
        if execution.readonly:
            return None
        store = execution.runtime.store
        task = self._claimed
        self._claimed = None
        if task is None:
            fresh = execution.guarded(lambda: store.get_row(execution.instance_id, self._key))
            if fresh is not None and fresh.has_value:
                execution.history[self._key] = fresh
                return fresh
            queue = _reservation(fresh or row or HistoryRow(self._key, None, "")).get("queue", "")
            if not execution.runtime.can_run_inline(self._activity_name, str(queue)):
                return None
            task = execution.guarded(
                lambda: store.claim_task(
                    execution.instance_id, self._key, execution.runtime.worker_id
                )
            )
        if task is None:
            return None
        execution.run_inline(task)
        fresh = execution.guarded(lambda: store.get_row(execution.instance_id, self._key))
        if fresh is not None and fresh.has_value:
            execution.history[self._key] = fresh
            return fresh
        return None

    def _outcome(self, row: HistoryRow) -> Any:
        value = json.loads(row.data) if row.data is not None else None
        if row.event_type == EV_ACTIVITY_COMPLETED:
            return value
        if row.event_type == EV_ACTIVITY_CANCELLED:
            error = error_from_envelope(value) if isinstance(value, dict) else exc.Cancelled()
            raise error
        raise error_from_envelope(value)


def _reservation(row: HistoryRow) -> dict[str, Any]:
    if not row.reservation:
        return {}
    try:
        data = json.loads(row.reservation)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _f(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
