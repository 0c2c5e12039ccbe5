"""Read-only replay: run workflow code against a portable history, write nothing.

Queries and replay checks use it. The caller gives the workflow function, the
codec and the clock (:class:`ReplayRuntime`); the replay has no store (every
unrecorded step stops it first, as a :class:`~.execution.Frontier`), runs no
activity, takes no lease and fires no hook.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import exceptions as exc
from .codec import Codec, error_to_envelope
from .context import WorkflowContext
from .events import Fence, HistoryRow, SignalPosition
from .execution import Execution
from .interrupt import Deadline, DeadlinePassed
from .portable import ABSENT, RecordedHistory, recorded_text
from .ports import ClaimedTask, ExecutionOutcome, ExecutionSnapshot

__all__ = [
    "ReplayResult",
    "ReplayRuntime",
    "answer_query",
    "check_replay",
    "history_at",
    "position_of",
    "query_handler_names",
    "replay",
    "snapshot_of",
]

WorkflowFunction = Callable[[Any, Any], Any]


class _NoStore:
    """Replay never reaches storage: every unrecorded step stops the replay first."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"read-only replay tried to use the store ({name})")


class ReplayRuntime:
    """The runtime of read-only replays: no store, no activities, no hooks."""

    worker_id = "replay"

    def __init__(self, codec: Codec, clock: Callable[[], datetime]) -> None:
        self.store: Any = _NoStore()
        self.codec = codec
        self._clock = clock

    def clock(self) -> datetime:
        """Return the configured clock's time (used only by code past the frontier)."""
        return self._clock()

    def lease_valid(self, fence: Fence) -> bool:
        return True

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        return False

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None:
        raise RuntimeError("read-only replay does not run activities")

    def tasks_reserved(self) -> None:
        return None

    def fire(self, hook: str, **fields: Any) -> None:
        return None


def snapshot_of(history: RecordedHistory) -> ExecutionSnapshot:
    """Return what an execution reads, from a portable history."""
    inst = history.instance
    return ExecutionSnapshot(
        instance_id=inst.instance_id,
        workflow_name=inst.workflow_name,
        input=None if inst.input is ABSENT else inst.input,
        status=inst.status,
        cancel_requested=inst.cancel_requested,
        cancel_reason=inst.cancel_reason,
        parent_instance_id=inst.parent_instance_id,
        parent_key=inst.parent_key,
        parked_seq=inst.parked_seq,
        parked_key=inst.parked_key,
        history_generation=inst.history_generation,
        history=[
            HistoryRow(
                key=e.key,
                seq=e.seq or None,
                command=e.command,
                event_type=e.event_type,
                data=recorded_text(e.data),
                reservation=recorded_text(e.reservation),
                delivered_seq=e.delivered_seq or None,
            )
            for e in history.events
        ],
        signals=[
            SignalPosition(s.id, s.channel, s.delivered_seq or None, s.consumed_seq or None)
            for s in history.signals
            if s.delivered_seq
        ],
    )


def position_of(history: RecordedHistory, at: str | int) -> int | None:
    """Return the command position that ``at`` names in ``history``.

    ``at`` is a history key or a command position (``seq``). The close record's key
    (``$close``) names the whole history: None. Anything else the history does not
    record as a command raises :class:`HistoryKeyNotFound` (a ``LookupError``).
    """
    instance_id = history.instance.instance_id
    if isinstance(at, bool) or not isinstance(at, int | str):
        raise TypeError(f"a history position is a key (str) or a seq (int), not {at!r}")
    for event in history.events:
        if isinstance(at, int) and event.seq == at and at > 0:
            return at
        if isinstance(at, str) and event.key == at:
            if event.seq:
                return event.seq
            if event.command == "close":
                return None
    last = max((event.seq for event in history.events if event.seq), default=0)
    raise exc.HistoryKeyNotFound(
        instance_id,
        at,
        f"the history of workflow instance {instance_id!r} records no command at {at!r} "
        f"(its commands are at positions 1 to {last}; keys as export_history shows them)",
    )


def history_at(history: RecordedHistory, seq: int) -> RecordedHistory:
    """Return ``history`` as it stood once the command at position ``seq`` was recorded.

    Commands after ``seq`` are left out, and so are deliveries and signal
    consumptions made after it, so a replay of the result stops at the command
    after ``seq`` (its frontier) with the delivered view of that moment. The
    instance reads as running: no close, nothing parked.
    """

    def upto(position: int) -> int:
        return position if 0 < position <= seq else 0

    return RecordedHistory(
        instance=dataclasses.replace(
            history.instance, status="running", output=ABSENT, parked_seq=0, parked_key=""
        ),
        events=[
            dataclasses.replace(event, delivered_seq=upto(event.delivered_seq))
            for event in history.events
            if 0 < event.seq <= seq
        ],
        signals=[
            dataclasses.replace(
                signal,
                delivered_seq=upto(signal.delivered_seq),
                consumed_seq=upto(signal.consumed_seq),
            )
            for signal in history.signals
        ],
        format=history.format,
    )


def replay(
    history: RecordedHistory,
    fn: WorkflowFunction,
    runtime: ReplayRuntime,
    deadline: float | None = None,
    on_deadline: Callable[[], BaseException] | None = None,
) -> tuple[Execution, ExecutionOutcome]:
    """Run ``fn`` read-only against ``history``; return the execution and how it ended.

    ``deadline`` (a ``time.monotonic()`` value) is checked at every command
    boundary; once passed, the replay stops with ``on_deadline()``.
    """
    execution = Execution(runtime, snapshot_of(history), None, readonly=True)
    execution.deadline, execution.on_deadline = deadline, on_deadline
    outcome = execution.run(fn, WorkflowContext(execution, execution.root_scope))
    return execution, outcome


def _error_matches(recorded: Any, replayed: BaseException | None) -> bool:
    if replayed is None or not isinstance(recorded, dict):
        return False
    env = error_to_envelope(replayed, with_traceback=False)
    return env.get("type") == recorded.get("type") and env.get("message") == recorded.get("message")


def _json_equal(a: Any, b: Any) -> bool:
    """Compare JSON values: key order and number spelling do not matter, ``true`` is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _closed_from_outside(recorded_error: Any) -> bool:
    """Whether a recorded failure was written without the workflow code's say: a
    terminate, or the failure of an instance whose writes the database kept refusing."""
    return (
        isinstance(recorded_error, dict)
        and recorded_error.get("kind") == "engine"
        and recorded_error.get("type") in ("WorkflowTerminated", "ExecutionStorageError")
    )


@dataclass(frozen=True)
class ReplayResult:
    """What a replay that matched found: how it went through each patch it met.

    ``patches`` maps each patch id the replayed code used, in the order it used
    them, to ``"new"`` (its marker is recorded: the new path), ``"old"`` (no
    marker: the history was recorded before the patch) or ``"deprecated"``
    (``deprecate_patch()`` found no marker). A patch past the point where a
    running history stops is not in it.
    """

    instance_id: str
    patches: dict[str, str]

    def describe_patches(self) -> str:
        """The patches as ``id=path`` words, for one line of a report."""
        return " ".join(f"{patch_id}={path}" for patch_id, path in self.patches.items())


def check_replay(
    history: RecordedHistory, fn: WorkflowFunction, runtime: ReplayRuntime
) -> ReplayResult:
    """Check workflow code ``fn`` against a recorded history.

    A running history may stop at its recorded frontier; a closed one must reach
    the recorded close with the same outcome, unless something other than its
    code closed it (a terminate, or too many storage errors): then, as for a
    running one, only its commands must match. Raises :class:`ReplayError` whose
    ``divergence`` is a :class:`NondeterminismError` (commands) or a
    :class:`ReplayOutcomeError` (outcome), and whose ``workflow_error`` is the
    error the replayed code raised, if any. Returns a :class:`ReplayResult`.
    """
    inst = history.instance
    execution, outcome = replay(history, fn, runtime)
    result = ReplayResult(inst.instance_id, dict(execution.patches))
    divergence: BaseException | None = None
    # A run closed from outside its code (terminated, or failed on storage errors) is
    # checked like a running one: its commands must match, wherever it then stops.
    closed_by_code = history.closed and not _closed_from_outside(inst.output)
    if isinstance(outcome.error, exc.NondeterminismError):
        divergence = outcome.error
    elif not closed_by_code:
        pass
    elif outcome.kind == "suspended":
        divergence = exc.NondeterminismError(
            f"replay of {inst.instance_id!r} stopped at command {execution.seq} "
            f"({execution.suspension}) before the recorded close",
            instance_id=inst.instance_id,
        )
    else:
        recorded_status = inst.status
        if outcome.kind == "completed":
            # Compare what the close would record: the output's JSON value (an output
            # that cannot be encoded becomes the same failure it became live).
            encoded = execution.close_request(outcome).output
            if encoded is not None:
                outcome.output = execution.runtime.codec.decode(encoded)
        replayed_status = outcome.kind
        if outcome.kind == "completed":
            if recorded_status == "completed" and _json_equal(inst.output, outcome.output):
                return result
        elif outcome.kind in ("failed", "cancelled"):
            if recorded_status == "cancelled" and isinstance(outcome.error, exc.Cancelled):
                return result
            if recorded_status == outcome.kind and _error_matches(inst.output, outcome.error):
                return result
            if recorded_status == "failed" and _error_matches(inst.output, outcome.error):
                return result
        divergence = exc.ReplayOutcomeError(
            inst.instance_id,
            recorded_status,
            replayed_status,
            None if inst.output is ABSENT else inst.output,
            outcome.output if outcome.kind == "completed" else repr(outcome.error),
        )
    if divergence is not None:
        workflow_error = outcome.workflow_error or outcome.error
        raise exc.ReplayError(inst.instance_id, divergence, workflow_error)
    return result


def query_handler_names(
    history: RecordedHistory,
    fn: WorkflowFunction,
    runtime: ReplayRuntime,
    *,
    deadline: float | None = None,
    seconds: float | None = None,
) -> list[str]:
    """Replay ``history`` read-only; return the query handlers registered where it stops.

    The names :func:`answer_query` would find, sorted; the same ``deadline`` rule.
    """
    instance_id = history.instance.instance_id

    def expired() -> BaseException:
        return exc.QueryTimeout(instance_id, "", seconds or 0.0)

    execution, outcome = replay(history, fn, runtime, deadline, expired)
    if isinstance(execution.fatal, exc.QueryTimeout):
        raise execution.fatal
    if isinstance(outcome.error, exc.NondeterminismError):
        raise outcome.error
    return sorted(execution.query_handlers)


def answer_query(
    history: RecordedHistory,
    fn: WorkflowFunction,
    runtime: ReplayRuntime,
    name: str,
    *,
    deadline: float | None = None,
    seconds: float | None = None,
) -> Any:
    """Replay ``history`` read-only and ask the query handler ``name`` where replay stops.

    ``deadline`` (monotonic) is checked at every command boundary and once more
    before the handler runs: past it, :class:`QueryTimeout` (for ``seconds``) is
    raised without running the handler. The handler itself runs under a
    :class:`~.interrupt.Deadline`: Python code of the handler (and of what it
    calls) still running at the deadline is interrupted, and :class:`QueryTimeout`
    is raised whatever the handler did with the interruption. The answer passes
    through JSON.
    """
    instance_id = history.instance.instance_id

    def expired() -> BaseException:
        return exc.QueryTimeout(instance_id, name, seconds or 0.0)

    execution, outcome = replay(history, fn, runtime, deadline, expired)
    if isinstance(execution.fatal, exc.QueryTimeout):
        raise execution.fatal
    if deadline is not None and time.monotonic() >= deadline:
        raise expired()  # the replay's last boundary was in time, but not the answer
    if isinstance(outcome.error, exc.NondeterminismError):
        raise outcome.error
    handler = execution.query_handlers.get(name)
    if handler is None:
        raise exc.QueryNotFound(name)
    guard = None if deadline is None else Deadline(deadline)
    try:
        with execution.answering_query():
            if guard is None:
                answer = handler()
            else:
                with guard:
                    answer = handler()
    except DeadlinePassed:
        raise expired() from None
    except exc.QueryCommandError:
        if guard is not None and guard.fired:
            raise expired() from None
        raise
    except BaseException as error:
        if guard is not None and guard.fired:
            raise expired() from None  # the handler turned the interruption into its error
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        raise exc.QueryFailed(name, error) from error
    if guard is not None and guard.fired:
        raise expired()  # the handler swallowed the interruption and answered late
    try:
        return json.loads(runtime.codec.encode_plain(answer, f"answer to query {name!r}"))
    except (TypeError, ValueError) as error:
        raise exc.QueryFailed(name, error) from error
