"""The workflow context: the handle workflow code issues durable commands through.

A context belongs to one execution and one cancellation *scope*. ``with_cancel()``
returns a context with a child scope and its cancel function; ``detached()``
returns a context with a parentless scope that ignores the durable cancel
request (for cleanup). Neither issues a command.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn, Protocol, TypeVar, overload

from .. import exceptions as exc
from . import commands, inbox, patches, streams
from .attributes import AttributeValue
from .codec import encode_progress
from .durations import Duration
from .events import HistoryRow
from .execution import Execution
from .handles import ChildHandle, Timer
from .identifiers import valid_channel
from .saga import Saga
from .scope import Scope

__all__ = ["ChildWorkflow", "WorkflowContext"]

InT = TypeVar("InT")
OutT = TypeVar("OutT")
OutT_co = TypeVar("OutT_co", covariant=True)
InT_contra = TypeVar("InT_contra", contravariant=True)


class ChildWorkflow(Protocol[InT_contra, OutT_co]):
    """What ``ctx.start_child()`` accepts besides a name: a workflow definition."""

    @property
    def name(self) -> str: ...

    def __call__(self, ctx: WorkflowContext, input: InT_contra, /) -> OutT_co: ...


class _ReplayAwareLogger(logging.LoggerAdapter):
    """Drops records while the execution replays, so replays do not repeat logs."""

    def __init__(self, execution: Execution) -> None:
        super().__init__(logging.getLogger("selvedge_django.workflow"), {})
        self._execution = execution

    def isEnabledFor(self, level: int) -> bool:
        execution = self._execution
        if execution.readonly or execution.is_replaying:
            return False
        return self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("instance_id", self._execution.instance_id)
        extra.setdefault("workflow_name", self._execution.workflow_name)
        kwargs["extra"] = extra
        return msg, kwargs


class WorkflowContext:
    """Issue durable commands: time, timers, signals, conditions, children, scopes."""

    def __init__(self, execution: Execution, scope: Scope) -> None:
        self._execution = execution
        self._scope = scope

    def __repr__(self) -> str:
        return f"<WorkflowContext {self._execution.instance_id!r}>"

    # -- accessors ----------------------------------------------------------------------

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

    @property
    def logger(self) -> logging.LoggerAdapter:
        """A logger that stays silent while the workflow replays."""
        return _ReplayAwareLogger(self._execution)

    def history_event(self, key: str) -> HistoryRow | None:
        """Return a copy of the recorded history row at ``key`` (read-only diagnostics)."""
        row = self._execution.history.get(key)
        return None if row is None else dataclasses.replace(row)

    # -- time ---------------------------------------------------------------------------

    def now(self) -> datetime:
        """Return workflow time (aware UTC), recorded once per live call.

        While the execution unwinds after a suspension (in a ``finally`` block or a
        context manager's exit) it raises that suspension again, like every other
        command, and records nothing.
        """
        return commands.now(self._execution)

    def sleep(self, duration: float | timedelta, sleep_id: str | None = None) -> None:
        """Wait for ``duration`` on a durable timer (nonpositive: expires at once)."""
        timer = commands.new_timer(self._execution, self._scope, duration, sleep_id)
        timer._wait(batch=True)

    def sleep_until(self, when: datetime, sleep_id: str | None = None) -> None:
        """Wait until the aware datetime ``when`` on a durable timer."""
        timer = commands.new_timer(self._execution, self._scope, None, sleep_id, until=when)
        timer._wait(batch=True)

    def new_timer(self, duration: float | timedelta, sleep_id: str | None = None) -> Timer:
        """Arm a durable timer without waiting; ``timer.get(ctx)`` waits for it."""
        return commands.new_timer(self._execution, self._scope, duration, sleep_id)

    # -- signals and conditions -----------------------------------------------------------

    def receive(self, channel: str) -> Any:
        """Consume the oldest signal of ``channel``, suspending until one exists."""
        return inbox.receive(self._execution, self._scope, channel)

    def receive_with_timeout(self, channel: str, timeout: float | timedelta) -> Any:
        """Like :meth:`receive`, raising :class:`ReceiveTimeout` after ``timeout``."""
        return inbox.receive_with_timeout(self._execution, self._scope, channel, timeout)

    def receive_async(self, channel: str) -> tuple[Any, bool]:
        """Record the next delivered signal of ``channel`` or that none was there."""
        return inbox.receive_async(self._execution, channel)

    def pending(self, channel: str) -> int:
        """Count delivered, unconsumed signals of ``channel`` (no I/O)."""
        execution = self._execution
        if not valid_channel(channel):
            raise execution.fail(
                exc.InvalidSignalChannel(f"pending() got an invalid channel {channel!r}")
            )
        return execution.pending(channel)

    def wait_condition(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true in the delivered view."""
        commands.wait_condition(self._execution, self._scope, predicate)

    # -- children -------------------------------------------------------------------------

    @overload
    def start_child(
        self,
        workflow_or_name: ChildWorkflow[InT, OutT],
        input: InT,
        child_id: str | None = None,
        *,
        execution_timeout: Duration | None = None,
    ) -> ChildHandle[OutT]: ...

    @overload
    def start_child(
        self,
        workflow_or_name: ChildWorkflow[None, OutT],
        input: None = None,
        child_id: str | None = None,
        *,
        execution_timeout: Duration | None = None,
    ) -> ChildHandle[OutT]: ...

    @overload
    def start_child(
        self,
        workflow_or_name: str,
        input: Any = None,
        child_id: str | None = None,
        *,
        execution_timeout: Duration | None = None,
    ) -> ChildHandle[Any]: ...

    def start_child(
        self,
        workflow_or_name: Any,
        input: Any = None,
        child_id: str | None = None,
        *,
        execution_timeout: Duration | None = None,
    ) -> ChildHandle[Any]:
        """Start a child workflow (by definition or name) with this instance as parent.

        ``execution_timeout`` (seconds or a timedelta) bounds the child's own run
        as for :func:`~selvedge_django.start_workflow`: still running that long
        after its start (database clock), it is terminated with the reason
        ``"execution timeout"`` and this workflow receives that failure. A bad
        value raises :class:`WorkflowStartRejected` before anything is written.
        """
        return commands.start_child(
            self._execution, self._scope, workflow_or_name, input, child_id, execution_timeout
        )

    # -- scopes ---------------------------------------------------------------------------

    def with_cancel(self) -> tuple[WorkflowContext, Callable[[], None]]:
        """Return a context in a child scope and the function that cancels it."""
        scope = Scope(parent=self._scope, detached=False)

        def cancel() -> None:
            commands.cancel_scope(self._execution, scope)

        return WorkflowContext(self._execution, scope), cancel

    def detached(self) -> WorkflowContext:
        """Return a context whose scope ignores the workflow's cancellation (for cleanup)."""
        return WorkflowContext(self._execution, Scope(parent=None, detached=True))

    def saga(self, *, parallel: bool = False, continue_on_error: bool = False) -> Saga:
        """Return a saga: ``with ctx.saga() as saga:`` then ``saga.add_compensation(...)``.

        When the block raises (an error or a cancellation), the compensations added
        so far run as durable activities on a detached context, last added first
        (all at once with ``parallel=True``), each with its own retries; then the
        block's error propagates. A compensation that fails for good raises
        :class:`CompensationError` (carrying both errors) instead; with
        ``continue_on_error=True`` the remaining compensations still run first. A
        block that completes runs none. See :mod:`selvedge_django.engine.saga`.
        """
        return Saga(
            self._execution,
            self.detached,
            parallel=parallel,
            continue_on_error=continue_on_error,
        )

    # -- continue-as-new ------------------------------------------------------------------

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this generation and run the workflow again from a fresh history with ``input``.

        Never returns: it unwinds the workflow code like a return (``finally``
        blocks run; commands issued while unwinding are rejected). One transaction
        then archives the generation's rows (as a resume archives them, with a
        close record whose value is ``input``), cancels its unfinished activities
        and timers, asks its running children to cancel, and makes the instance
        runnable under the same id with ``input``, the next generation and a new
        lease epoch. Signals it had not consumed stay in the inbox for the next
        generation, in their order. An input that cannot be stored raises
        :class:`WorkflowStartRejected` here, and nothing is written.
        """
        commands.continue_as_new(self._execution, input)

    # -- patches --------------------------------------------------------------------------

    def patched(self, patch_id: str) -> bool:
        """Return True on the new code path of a patch, False for a run recorded before it.

        Live, it records a marker and returns True. In replay it returns True when
        the marker of ``patch_id`` is recorded at this position, and False, consuming
        nothing, when history holds another command here or the recorded run went no
        further (its code had no patch). Each patch id once per run.
        """
        return patches.patched(self._execution, patch_id)

    def deprecate_patch(self, patch_id: str) -> Literal[True]:
        """Keep replaying histories that hold the marker of ``patch_id``; record nothing.

        The step after every instance that took the old path has closed: the
        ``if ctx.patched(...)`` goes, the new code stays, and histories with and
        without the marker both replay. Always returns True.
        """
        return patches.deprecate_patch(self._execution, patch_id)

    # -- progress -------------------------------------------------------------------------

    def set_progress(self, value: Any) -> None:
        """Store ``value`` (JSON, at most 64 KiB encoded) as the instance's progress.

        Not a command and not history: clients read the last value without a
        replay (``describe(id).progress``, the admin). Each live call writes it in
        one fenced statement. Calls that an earlier execution already made (before the last
        command it recorded or the wait it suspended at), and calls in queries and
        replay checks, write nothing, so a re-execution never sets progress back. A
        value that is not JSON raises TypeError or ValueError, one too large
        :class:`PayloadTooLarge`.
        """
        execution = self._execution
        execution.check_command("set_progress()")
        text = encode_progress(execution.runtime.codec, value, "progress")
        # The furthest position earlier executions reached, as for patches.
        reached = max(execution.max_recorded_seq, execution.snapshot.parked_seq)
        if execution.readonly or execution.seq < reached:
            return
        fence = execution.fence
        assert fence is not None
        execution.guarded(lambda: execution.runtime.store.set_progress(fence, text))

    # -- search attributes ----------------------------------------------------------------

    def set_attributes(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Set search attributes of this instance; a ``None`` value removes the name.

        A command: recorded once, in one transaction with the attribute rows that
        ``find_instances(attributes=...)`` searches, and passed over in replay (nothing
        written again); a later value of a name wins. Names are 1 to 64 characters of
        ``[a-z0-9_]``; values a ``str`` (at most 255 characters), ``int``, ``float``,
        ``bool`` or aware ``datetime``. A bad name or value raises ``ValueError``
        before anything is recorded, and the workflow may catch it.
        """
        commands.set_attributes(self._execution, attributes)

    # -- streams --------------------------------------------------------------------------

    def write_stream(self, key: str, value: Any) -> int:
        """Append ``value`` (JSON) to this instance's stream ``key``; return its ``seq``.

        A command: the entry and its history row commit together, once; a replay
        (after a crash, on another worker, from the workflow cache) finds the row
        and writes nothing new. Readers (:func:`~selvedge_django.read_stream`) see
        the entry as soon as it commits. ``key`` is 1 to 255 characters
        (``ValueError`` otherwise); a value that is not JSON raises TypeError or
        ValueError, one over ``MAX_PAYLOAD_BYTES`` :class:`PayloadTooLarge`, before
        anything is recorded. A closed stream raises :class:`StreamClosed`, an
        instance holding ``MAX_STREAM_ENTRIES`` entries :class:`StreamLimitExceeded`:
        nothing is written, and a replay raises the same error again.
        """
        return streams.write_stream(self._execution, key, value)

    def close_stream(self, key: str) -> None:
        """End this instance's stream ``key`` (a command, recorded once).

        Readers finish once they have read its last entry; later writes, from the
        workflow or its activities, raise :class:`StreamClosed`. Every stream of an
        instance also counts as closed once the instance is closed.
        """
        streams.close_stream(self._execution, key)

    # -- queries --------------------------------------------------------------------------

    def set_query_handler(self, name: str, handler: Callable[[], object] | None) -> None:
        """Register (or with None remove) a zero-argument query handler."""
        execution = self._execution
        if execution.in_query:
            raise exc.QueryCommandError("set_query_handler() called inside a query handler")
        if execution.in_predicate:
            raise execution.nondeterminism("set_query_handler called inside a predicate")
        if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= 255:
            raise ValueError("query names contain 1 to 255 bytes")
        if handler is None:
            execution.query_handlers.pop(name, None)
        elif not callable(handler):
            raise TypeError("a query handler must be callable")
        else:
            execution.query_handlers[name] = handler
