"""The replay engine: one execution of workflow code against its recorded history.

An execution runs the workflow function on the calling thread, from the start.
Each command takes the next command position and a history key; when the key is
recorded the command returns the recorded value (replay), otherwise it writes
through the store under the execution's fence (live). A wait that cannot
complete raises :class:`Suspend`, a ``BaseException`` that unwinds the user's
frames (``finally`` blocks run) and makes the dispatcher release the lease; a
later dispatch replays from the start.

Visibility follows the seeds' *delivered view*: an arrival (activity result,
timer fire, child outcome, signal) becomes visible to ``is_ready()`` and
``pending()`` only from the command position of the batching wait that
delivered it, so replay rebuilds exactly what the original run saw.

Nothing here imports Django: the runtime hands the execution its store, codec,
clock and activity runner, and the caller builds the workflow context it runs
the code with (``execution.run(fn, WorkflowContext(execution, execution.root_scope))``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from .. import exceptions as exc
from .codec import error_to_envelope
from .events import Arrivals, Fence, HistoryRow, SignalPosition
from .identifiers import instance_id_problem
from .leftovers import leftover_divergence
from .ports import (
    CloseRequest,
    ExecutionOutcome,
    ExecutionSnapshot,
    HistoryLimits,
    Observation,
    ObservationResult,
    Runtime,
)
from .scope import Scope

__all__ = [
    "ContinueAsNew",
    "Execution",
    "ExecutionOutcome",
    "Frontier",
    "Suspend",
    "current_execution",
]

logger = logging.getLogger("selvedge_django.engine")

RESERVED_KEY_PREFIXES = ("$", "#")


class Suspend(BaseException):
    """Unwinds workflow code when a wait cannot complete. Never catch it."""


class Frontier(Suspend):
    """A read-only replay reached the first unrecorded command."""


class ContinueAsNew(BaseException):
    """Unwinds workflow code after ``ctx.continue_as_new()``. Never catch it.

    ``input_text`` is the JSON text of the next generation's input.
    """

    def __init__(self, input_text: str) -> None:
        super().__init__("continue-as-new")
        self.input_text = input_text


_local = threading.local()


def current_execution() -> Execution | None:
    """Return the execution running on this thread, if any."""
    return getattr(_local, "execution", None)


def _row_size(row: HistoryRow, exact: bool) -> int:
    data, reservation = row.data or "", row.reservation or ""
    if exact:
        return len(data.encode("utf-8")) + len(reservation.encode("utf-8"))
    return len(data) + len(reservation)


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
        self.signals: dict[int, SignalPosition] = {s.id: s for s in snapshot.signals}
        self.max_recorded_seq = max(self.by_seq, default=0)
        self.patches: dict[str, str] = {}  # each patch id's path (engine.patches)
        self.last_key = ""
        self.limits: HistoryLimits | None = (
            None if self.readonly else getattr(runtime, "history_limits", None)
        )
        # The size of the stored values, in characters until it could matter (a
        # character is 1 to 4 bytes of UTF-8), then in bytes.
        self._size_exact = False
        self._size = (
            0 if self.limits is None else sum(_row_size(r, False) for r in snapshot.history)
        )
        self.seq = 0
        self.used_keys: set[str] = set()
        # The streams this run closed (engine.streams): a later write is refused locally.
        self.closed_streams: set[str] = set()
        self.observed: set[str] = set()
        self.thread_id: int | None = None
        self.fatal: BaseException | None = None
        self.fatal_abandons = False
        self.suspension: Suspend | None = None
        # Set by ctx.continue_as_new(): the execution ends there, like a return.
        self.continuation: ContinueAsNew | None = None
        # What the workflow code raised when a divergence was found after it.
        self.workflow_error: BaseException | None = None
        # The lease was released by the write that made this execution suspend.
        self.released = False
        self.in_activity = False
        self.in_predicate = False
        self.in_query = False
        self.candidate_keys: frozenset[str] = frozenset()
        self.candidate_signals: frozenset[int] = frozenset()
        self.time_floor: datetime | None = None
        self.query_handlers: dict[str, Callable[[], Any]] = {}
        # A read-only replay for a query with a timeout: the monotonic deadline and how
        # to report it, checked at every command boundary.
        self.deadline: float | None = None
        self.on_deadline: Callable[[], BaseException] | None = None
        # A replay under a debugger: called with (seq, key, command) as each command
        # takes its position, before it is checked against history.
        self.before_command: Callable[[int, str, str], None] | None = None
        self.root_scope = Scope(parent=None, detached=False)

    # -- state ------------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        return self.seq < self.max_recorded_seq

    @property
    def live(self) -> bool:
        return not self.readonly

    def fail(self, error: BaseException, *, abandon: bool = False) -> BaseException:
        """Make ``error`` sticky: the execution ends with it whatever user code does."""
        if self.fatal is None:
            self.fatal = error
            self.fatal_abandons = abandon
        return self.fatal

    def decode_stored(self, text: str | None) -> Any:
        """Decode a stored value; one this process cannot decrypt stops the execution.

        A :class:`PayloadDecodeError` is sticky and abandons the execution: nothing
        is written, and the worker leaves the instance for one that has the key.
        """
        try:
            return self.runtime.codec.decode(text)
        except exc.PayloadDecodeError as error:
            raise self.fail(error, abandon=True) from None

    def open_stored_error(self, env: Any) -> Any:
        """A stored error envelope opened (see :meth:`decode_stored`)."""
        try:
            return self.runtime.codec.open_error(env)
        except exc.PayloadDecodeError as error:
            raise self.fail(error, abandon=True) from None

    def nondeterminism(self, message: str, **fields: str) -> BaseException:
        return self.fail(exc.NondeterminismError(message, instance_id=self.instance_id, **fields))

    def check_command(self, what: str = "workflow command") -> None:
        """Reject commands from foreign threads, activities, predicates or unwinding."""
        if self.in_query:
            raise exc.QueryCommandError(f"{what} issued inside a query handler")
        if self.deadline is not None and self.fatal is None and time.monotonic() >= self.deadline:
            assert self.on_deadline is not None
            # Not the code's failure: the execution is abandoned, not checked for leftovers.
            raise self.fail(self.on_deadline(), abandon=True)
        if self.thread_id is not None and threading.get_ident() != self.thread_id:
            raise self.nondeterminism(f"{what} issued from a thread that is not the workflow's")
        if self.fatal is not None:
            raise self.fatal
        if self.suspension is not None:
            raise self.suspension
        if self.continuation is not None:
            raise self.continuation
        if self.in_activity:
            raise self.nondeterminism(f"{what} issued inside an activity")
        if self.in_predicate:
            raise self.nondeterminism(f"{what} issued inside a wait_condition predicate")

    def cancellation(self, scope: Scope) -> BaseException | None:
        """The cancellation a blocking wait in ``scope`` observes now (live), if any."""
        if scope.locally_cancelled():
            return exc.ScopeCancelled()
        if not scope.attached():
            return None
        store = self.runtime.store
        requested, reason = self.guarded(lambda: store.cancel_state(self.instance_id))
        if requested:
            return exc.WorkflowCancelled(self.instance_id, reason)
        return None

    @contextmanager
    def running_activity(self) -> Iterator[None]:
        """Mark an inline activity attempt: workflow commands are refused inside it."""
        self.in_activity = True
        try:
            yield
        finally:
            self.in_activity = False

    @contextmanager
    def evaluating_predicate(self) -> Iterator[None]:
        """Mark a ``wait_condition`` predicate: workflow commands are refused inside it."""
        self.in_predicate = True
        try:
            yield
        finally:
            self.in_predicate = False

    @contextmanager
    def with_candidates(self, arrivals: Arrivals) -> Iterator[None]:
        """Let a predicate see ``arrivals`` as if delivered, for one evaluation."""
        self.candidate_keys = frozenset(arrivals.keys)
        self.candidate_signals = frozenset(sid for sid, _ in arrivals.signals)
        try:
            yield
        finally:
            self.candidate_keys = frozenset()
            self.candidate_signals = frozenset()

    @contextmanager
    def answering_query(self) -> Iterator[None]:
        """Mark a query handler's run: workflow commands raise QueryCommandError inside it."""
        self.in_query = True
        try:
            yield
        finally:
            self.in_query = False

    def suspend(self, why: str) -> Suspend:
        """Return the suspension to raise; later commands are rejected without writes."""
        self.suspension = Frontier(why) if self.readonly else Suspend(why)
        return self.suspension

    def wait_here(self, why: str, sleep: float | None = None) -> None:
        """Park at a live wait that cannot complete; raise Suspend when not kept (or let go).

        Without a workflow cache, such a wait raises :class:`Suspend`: the code unwinds,
        the lease is released, and the next lease replays the code from its start. A
        runtime that keeps executions (its ``park(execution, why, sleep)``, see
        :mod:`selvedge_django.worker.cache`) releases the lease itself and blocks this
        thread until the instance is leased to it again; ``wait_here`` then returns
        with the new fence, and the wait looks again for what arrived, exactly where a
        replay would look. Each live wait calls it in a loop (``while not ready:
        execution.wait_here(...)``). ``sleep`` is how many seconds the wait lasts by
        itself (a timer's): the runtime may decline to keep a long sleep.
        """
        park = getattr(self.runtime, "park", None)
        if (
            park is None
            or self.readonly
            or self.fatal is not None
            or self.suspension is not None
            or self.continuation is not None
            or self.in_predicate
            or self.in_activity
            # Recorded commands past this position: the suspension judges them (leftovers).
            or self.seq < self.max_recorded_seq
        ):
            raise self.suspend(why)
        # None: not kept (the lease still held), or let go after the release.
        fence = park(self, why, sleep)
        if fence is None:
            raise self.suspend(why)
        self.fence = fence
        self.released = False

    def continue_as_new(self, input_text: str) -> ContinueAsNew:
        """Return the unwinding to raise; later commands are rejected without writes."""
        self.continuation = ContinueAsNew(input_text)
        return self.continuation

    def next_position(self, key: str | None, command: str, label: str) -> tuple[int, str]:
        """Take the next command position and validate its key against history."""
        self.seq += 1
        seq = self.seq
        if self.limits is not None and seq > self.max_recorded_seq:
            self._check_limits()
        if key is None:
            key = f"#{seq}:{label}"[:255]
        if self.before_command is not None:
            self.before_command(seq, key, command)
        at_seq = self.by_seq.get(seq)
        parked = self.snapshot.parked_key  # the unrecorded wait the last execution parked at
        if at_seq is None and seq == self.snapshot.parked_seq and parked not in ("", key):
            message = f"command {seq} is {command} {key!r}; the last execution waited at {parked!r}"
            raise self.nondeterminism(message, key=parked, expected="wait", actual=command)
        if at_seq is not None and at_seq.key != key:
            raise self.nondeterminism(
                f"command {seq} is {command} {key!r} but history recorded "
                f"{at_seq.command} {at_seq.key!r}",
                key=at_seq.key,
                expected=at_seq.command,
                actual=command,
            )
        recorded = self.history.get(key)
        if recorded is not None and recorded.seq != seq:
            raise self.nondeterminism(
                f"key {key!r} was recorded at position {recorded.seq}, reached at {seq}",
                key=key,
                expected=recorded.command,
                actual=command,
            )
        if recorded is not None and recorded.command != command:
            raise self.nondeterminism(
                f"key {key!r} recorded {recorded.command}, code issued {command}",
                key=key,
                expected=recorded.command,
                actual=command,
            )
        self.used_keys.add(key)
        self.last_key = key
        return seq, key

    def _check_limits(self) -> None:
        """Fail the run (sticky) before a new command once the history is at a limit."""
        limits = self.limits
        assert limits is not None
        if len(self.history) >= limits.events:
            raise self.fail(
                exc.HistoryLimitExceeded(
                    self.instance_id,
                    "MAX_HISTORY_EVENTS",
                    limits.events,
                    f"the history of workflow instance {self.instance_id!r} holds "
                    f"{len(self.history)} events, the limit (MAX_HISTORY_EVENTS); "
                    "the instance is failed instead of recording more",
                )
            )
        if not self._size_exact and self._size * 4 > limits.bytes:
            self._size = sum(_row_size(r, True) for r in self.history.values())
            self._size_exact = True
        if self._size > limits.bytes:
            raise self.fail(
                exc.HistoryLimitExceeded(
                    self.instance_id,
                    "MAX_HISTORY_BYTES",
                    limits.bytes,
                    f"the values recorded in the history of workflow instance "
                    f"{self.instance_id!r} reached {self._size} bytes, over the limit "
                    f"(MAX_HISTORY_BYTES) of {limits.bytes}; the instance is failed "
                    "instead of recording more",
                )
            )

    def keep_row(self, key: str, row: HistoryRow) -> None:
        """Store a row in the local view, counting the size of its values."""
        if self.limits is not None:
            old = self.history.get(key)
            self._size += _row_size(row, self._size_exact) - (
                0 if old is None else _row_size(old, self._size_exact)
            )
        self.history[key] = row

    def validate_user_key(self, key: object, what: str) -> str:
        if not isinstance(key, str) or not key or len(key) > 255:
            raise exc.HistoryKeyConflict(f"{what} must be a string of 1 to 255 characters")
        if instance_id_problem(key, what) is not None:
            # NUL, which PostgreSQL refuses in text, and lone surrogates, which no database
            # can encode: refused here rather than on every replay's write.
            raise exc.HistoryKeyConflict(
                f"{what} {key!r} must not contain control characters or lone surrogates"
            )
        if key.startswith(RESERVED_KEY_PREFIXES):
            raise exc.HistoryKeyConflict(f"{what} {key!r} uses a reserved prefix ($ or #)")
        if key in self.used_keys:
            raise exc.HistoryKeyConflict(f"{what} {key!r} is already used by this execution")
        return key

    def guarded(self, op: Callable[[], Any]) -> Any:
        """Run a store operation: lease belief checked first, failures made sticky."""
        assert self.fence is not None
        if not self.runtime.lease_valid(self.fence):
            raise self.fail(
                exc.LeaseLost(f"lease on {self.instance_id!r} can no longer be proven"),
                abandon=True,
            )
        try:
            return op()
        except exc.HistoryKeyConflict as error:
            raise self.fail(error)
        except (exc.Fenced, exc.LeaseLost) as error:
            raise self.fail(error, abandon=True)
        except Exception as error:
            # A storage failure: the run cannot know what was written. Stop here; the
            # instance is dispatched again and replays.
            raise self.fail(error, abandon=True)

    def check_stored(self, key: str, stored: HistoryRow, command: str) -> HistoryRow:
        if stored.command != command:
            raise self.nondeterminism(
                f"key {key!r} holds {stored.command}, code issued {command}",
                key=key,
                expected=stored.command,
                actual=command,
            )
        self.keep_row(key, stored)
        return stored

    def record(self, row: HistoryRow) -> HistoryRow:
        """Insert a command row with its value (live)."""
        fence = self.fence
        assert fence is not None
        stored: HistoryRow = self.guarded(lambda: self.runtime.store.record_command(fence, row))
        return self.check_stored(row.key, stored, row.command)

    def observe(self, observation: Observation) -> ObservationResult:
        """Commit an observation and fold what it delivered into the local view."""
        fence = self.fence
        assert fence is not None
        store = self.runtime.store
        result: ObservationResult = self.guarded(lambda: store.observe(fence, observation))
        self.fold(observation, result)
        return result

    def fold(self, observation: Observation, result: ObservationResult) -> None:
        """Fold a committed observation (stored, delivered, consumed) into the local view."""
        seq = observation.seq
        if not result.consumed:
            raise self.fail(
                exc.HistoryKeyConflict("signal was consumed by another execution"), abandon=True
            )
        if result.stored is not None:
            self.check_stored(result.stored.key, result.stored, result.stored.command)
        self.apply_delivery(seq, result.delivered)
        for key, _, _ in observation.fill_cancelled:
            self.refresh(key)
        if (consumed := observation.consume) is not None:
            self.signals.setdefault(consumed, SignalPosition(consumed, "")).consumed_seq = seq

    def apply_delivery(self, seq: int, delivered: Arrivals) -> None:
        for key in delivered.keys:
            row = self.history.get(key)
            if row is None or not row.has_value:
                # Re-read only what arrived since loading: a value, once recorded, never
                # changes, so a row known with its value (such as every value this
                # execution recorded itself) needs no read.
                row = self.refresh(key)
            if row is not None:
                row.delivered_seq = seq
        for signal_id, channel in delivered.signals:
            position = self.signals.get(signal_id)
            if position is None:
                position = self.signals[signal_id] = SignalPosition(signal_id, channel)
            position.channel = channel
            position.delivered_seq = seq

    def arrived(self, key: str, event_type: str, data: str) -> None:
        """Take a value read with a new lease at ``key`` (the command this execution
        waited at), as :meth:`refresh` would read it there: kept only when the row is
        known here without a value (a recorded value never changes)."""
        row = self.history.get(key)
        if row is None or row.has_value or self.readonly:
            return
        self.keep_row(
            key,
            HistoryRow(
                row.key, row.seq, row.command, event_type, data, row.reservation, row.delivered_seq
            ),
        )

    def refresh(self, key: str) -> HistoryRow | None:
        """Re-read one row (live) so a value that arrived since loading is known."""
        if self.readonly:
            return self.history.get(key)
        store = self.runtime.store
        fresh: HistoryRow | None = self.guarded(lambda: store.get_row(self.instance_id, key))
        if fresh is not None:
            self.keep_row(key, fresh)
        return fresh

    # -- the delivered view -------------------------------------------------------------

    def visible(self, key: str) -> bool:
        """True when the row's value is in the delivered view at this position."""
        if key in self.observed:
            return True
        row = self.history.get(key)
        if row is None or not row.has_value:
            return False
        if row.delivered_seq is not None and row.delivered_seq <= self.seq:
            return True
        return key in self.candidate_keys

    def pending(self, channel: str) -> int:
        """Delivered, unconsumed signals of ``channel`` at this position."""
        count = 0
        for position in self.signals.values():
            if position.channel != channel:
                continue
            delivered = (
                position.delivered_seq is not None and position.delivered_seq <= self.seq
            ) or position.id in self.candidate_signals
            if not delivered:
                continue
            if position.consumed_seq is None or position.consumed_seq > self.seq:
                count += 1
        return count

    def oldest_pending(self, channel: str) -> SignalPosition | None:
        for signal_id in sorted(self.signals):
            position = self.signals[signal_id]
            if position.channel != channel or position.delivered_seq is None:
                continue
            if position.delivered_seq > self.seq:
                continue
            if position.consumed_seq is None or position.consumed_seq > self.seq:
                return position
        return None

    # -- workflow time ------------------------------------------------------------------

    def advance_floor(self, value: datetime) -> None:
        if self.time_floor is None or value > self.time_floor:
            self.time_floor = value

    def time_base(self) -> datetime:
        """The larger of the configured clock and the execution's time floor."""
        now = self.runtime.clock()
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        now = now.astimezone(UTC)
        if self.time_floor is not None and now < self.time_floor:
            return self.time_floor
        return now

    # -- running ----------------------------------------------------------------------

    def run(self, fn: Callable[[Any, Any], Any], context: Any) -> ExecutionOutcome:
        """Run ``fn(context, input)`` once and classify how it ended (no close written).

        ``context`` is the handle the code issues commands through, built by the
        caller on this execution and its :attr:`root_scope`.
        """
        self.thread_id = threading.get_ident()
        previous = getattr(_local, "execution", None)
        _local.execution = self
        try:
            try:
                stored_input = self.runtime.codec.open(self.snapshot.input)
            except exc.PayloadDecodeError as error:
                self.fail(error, abandon=True)
                return ExecutionOutcome("abandoned", error=error)
            try:
                output = fn(context, self.runtime.codec.argument(fn, 1, stored_input))
            except BaseException as error:
                if self.suspension is not None or isinstance(error, Suspend):
                    return self._after_suspension()
                if self.continuation is not None:
                    return self._after_continuation()
                return self._classify_error(error)
            if self.suspension is not None and self.fatal is None:
                self.nondeterminism("workflow code swallowed a suspension (except BaseException?)")
            if self.continuation is not None and self.fatal is None:
                self.nondeterminism(
                    "workflow code swallowed continue_as_new() (except BaseException?)"
                )
            if self.fatal is not None:
                return self._fatal_outcome()
            if self._diverged_by_leftovers("return", None):
                return self._fatal_outcome()
            return ExecutionOutcome("completed", output=output)
        finally:
            _local.execution = previous

    def _after_suspension(self) -> ExecutionOutcome:
        if self.fatal is not None:
            return self._fatal_outcome()
        if self._diverged_by_leftovers("wait", None):
            return self._fatal_outcome()
        return ExecutionOutcome("suspended")

    def _after_continuation(self) -> ExecutionOutcome:
        assert self.continuation is not None
        if self.fatal is not None:
            return self._fatal_outcome()
        if self._diverged_by_leftovers("continue", None):
            return self._fatal_outcome()
        return ExecutionOutcome("continued", output=self.continuation.input_text)

    def _classify_error(self, error: BaseException) -> ExecutionOutcome:
        if self.fatal is not None:
            return self._fatal_outcome()
        cancelled = isinstance(error, exc.Cancelled)
        if self._diverged_by_leftovers("cancel" if cancelled else "raise", error):
            return self._fatal_outcome()
        return ExecutionOutcome("cancelled" if cancelled else "failed", error=error)

    def _fatal_outcome(self) -> ExecutionOutcome:
        assert self.fatal is not None
        if self.fatal_abandons:
            return ExecutionOutcome("abandoned", error=self.fatal)
        if not isinstance(self.fatal, exc.NondeterminismError):
            # A sticky failure of the code (a predicate that raised, a key conflict)
            # stops it too: history recorded past that point is still a divergence.
            self._diverged_by_leftovers("raise", self.fatal)
        return ExecutionOutcome("failed", error=self.fatal, workflow_error=self.workflow_error)

    def _diverged_by_leftovers(self, ending: str, error: BaseException | None) -> bool:
        """Fail the run when history records commands past where it stopped (see
        :func:`.leftovers.leftover_divergence`)."""
        divergence = leftover_divergence(self.by_seq, self.seq, self.instance_id, ending, error)
        if divergence is None:
            return False
        self.workflow_error = error
        self.fatal = divergence
        self.fatal_abandons = False
        return True

    def close_request(self, outcome: ExecutionOutcome) -> CloseRequest:
        """Encode a closing outcome; an unencodable output fails the workflow instead."""
        codec = self.runtime.codec
        rows = [row for row in self.history.values() if row.seq is not None]
        extra = {
            "unfinished": any(not row.has_value for row in rows),
            "children": any(row.command == "child" for row in rows),
            "parent": (self.snapshot.parent_instance_id, self.snapshot.parent_key),
        }
        if outcome.kind == "completed":
            try:
                text = codec.encode(outcome.output, "workflow output")
            except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
                outcome.kind = "failed"
                outcome.error = exc.ApplicationError(str(error), type=type(error).__name__)
            except (TypeError, ValueError) as error:
                outcome.kind = "failed"
                outcome.error = exc.ApplicationError(
                    f"workflow output is not JSON: {error}", type="OutputEncodingError"
                )
            else:
                return CloseRequest("completed", text, None, **extra)  # type: ignore[arg-type]
        assert outcome.error is not None
        envelope = json.dumps(error_to_envelope(outcome.error, codec=codec))
        return CloseRequest(outcome.kind, None, envelope, **extra)  # type: ignore[arg-type]
