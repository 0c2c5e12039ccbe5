"""The error tree of selvedge_django.

Every error the library raises derives from :class:`SelvedgeError`, except the
cancellation family (:class:`Cancelled`), which derives from ``BaseException``
like ``asyncio.CancelledError`` so that ``except Exception`` in workflow code
does not swallow it. Subclasses use their docstring as the default message.

This module imports nothing from Django: the replay engine depends on it.
"""

from __future__ import annotations

from typing import Any


class SelvedgeError(Exception):
    """A selvedge_django error."""

    def __init__(self, message: str | None = None) -> None:
        if message is None:
            message = (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


# -- client and registry errors ---------------------------------------------------------


class WorkflowNotFound(SelvedgeError, LookupError):
    """Workflow instance not found."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"workflow instance {instance_id!r} not found")


class WorkflowAlreadyStarted(SelvedgeError):
    """A workflow instance with this id already exists."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"workflow instance {instance_id!r} already exists")


class WorkflowStartRejected(SelvedgeError):
    """The start was refused before any row was written."""


class InstanceClosed(SelvedgeError):
    """The workflow instance is closed."""

    status: str = ""

    def __init__(self, instance_id: str, status: str | None = None) -> None:
        self.instance_id = instance_id
        if status is not None:
            self.status = status
        super().__init__(f"workflow instance {instance_id!r} is already {self.status}")

    @staticmethod
    def for_status(instance_id: str, status: str) -> InstanceClosed:
        """Return the subclass matching a terminal status."""
        cls = _CLOSED_BY_STATUS.get(status, InstanceClosed)
        return cls(instance_id, status)


class WorkflowAlreadyCompleted(InstanceClosed):
    """The workflow instance already completed."""

    status = "completed"


class WorkflowAlreadyFailed(InstanceClosed):
    """The workflow instance already failed."""

    status = "failed"


class WorkflowAlreadyCancelled(InstanceClosed):
    """The workflow instance was already cancelled."""

    status = "cancelled"


_CLOSED_BY_STATUS: dict[str, type[InstanceClosed]] = {
    "completed": WorkflowAlreadyCompleted,
    "failed": WorkflowAlreadyFailed,
    "cancelled": WorkflowAlreadyCancelled,
}


class InvalidSignalChannel(SelvedgeError, ValueError):
    """Signal channel must contain 1 to 255 UTF-8 bytes."""


class InvalidSignalPayload(SelvedgeError, ValueError):
    """Signal payload could not be encoded as JSON."""


class ActivityNameConflict(SelvedgeError):
    """Another activity is already registered under this name."""


class WorkflowNameConflict(SelvedgeError):
    """Another workflow is already registered under this name."""


class WorkflowNotRegistered(SelvedgeError, LookupError):
    """No workflow is registered under this name in this process."""

    def __init__(self, workflow_name: str) -> None:
        self.workflow_name = workflow_name
        super().__init__(f"workflow {workflow_name!r} is not registered in this process")


class InvalidSchedule(SelvedgeError, ValueError):
    """The schedule's definition is invalid; nothing was written."""


class ScheduleAlreadyExists(InvalidSchedule):
    """A schedule with this name already exists."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"schedule {name!r} already exists")


class ScheduleNotFound(SelvedgeError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"schedule {name!r} not found")


class PayloadTooLarge(SelvedgeError, ValueError):
    """The encoded value is larger than MAX_PAYLOAD_BYTES."""


class PayloadTooDeep(SelvedgeError, ValueError):
    """The value nests lists and objects deeper than the engine stores."""


class PayloadConversionError(SelvedgeError, TypeError):
    """A stored value does not fit the annotation it is read back as (PAYLOAD_CONVERTER)."""


class PayloadDecodeError(SelvedgeError):
    """A stored value is encrypted under a key (or codec) this process does not have.

    ``key_id`` names the key the value was encoded with, ``codec_id`` the codec
    (``SELVEDGE["PAYLOAD_CODEC"]``); neither is secret.
    """

    def __init__(self, key_id: str = "", codec_id: str = "", message: str | None = None) -> None:
        self.key_id = key_id
        self.codec_id = codec_id
        super().__init__(
            message
            or f"cannot decode a stored value encoded by codec {codec_id!r} with key {key_id!r}:"
            " the key is not in SELVEDGE['PAYLOAD_KEYS'] (or the value is corrupt)"
        )


class InboxFull(SelvedgeError):
    """The instance already holds MAX_PENDING_SIGNALS unconsumed signals."""

    def __init__(self, instance_id: str, limit: int) -> None:
        self.instance_id = instance_id
        self.limit = limit
        super().__init__(
            f"workflow instance {instance_id!r} already holds {limit} unconsumed signals"
            " (MAX_PENDING_SIGNALS); the signal was refused"
        )


class HistoryLimitExceeded(SelvedgeError):
    """The instance's history reached MAX_HISTORY_EVENTS or MAX_HISTORY_BYTES.

    As a workflow outcome it means the instance was failed instead of recording
    more; from ``export_history`` or ``query``, that the history is larger than
    the limit allows a read to load.
    """

    def __init__(
        self, instance_id: str, limit: str, value: int, message: str | None = None
    ) -> None:
        self.instance_id = instance_id
        self.limit = limit
        self.value = value
        super().__init__(
            message or f"the history of workflow instance {instance_id!r} reached {limit} ({value})"
        )


# -- execution errors -------------------------------------------------------------------


class ExecutionStorageError(SelvedgeError):
    """The database kept refusing the writes of the instance's executions.

    As a workflow outcome: the instance was failed without running its code
    further. ``data_error`` is True when the database refused a value (a
    ``DataError``, an ``IntegrityError`` that is no known conflict, a value out of
    range or that cannot be encoded: trying again would fail the same way) and
    the instance failed at the first such error; otherwise ``errors``
    consecutive executions ended on an error such as an ``OperationalError``
    (``MAX_EXECUTION_ERRORS``), each one held back longer than the last.
    """

    def __init__(
        self,
        instance_id: str = "",
        errors: int = 0,
        data_error: bool = False,
        message: str | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.errors = errors
        self.data_error = data_error
        super().__init__(
            message
            or f"the database refused the writes of workflow instance {instance_id!r}"
            f" ({errors} executions in a row)"
        )


class PreparedStatementError(SelvedgeError):
    """A prepared statement was missing from the database session the statement ran in.

    Raised by the engine's statements on PostgreSQL when they are prepared (the
    default, ``SELVEDGE["PREPARED_STATEMENTS"]``; or ``server_side_binding`` with
    ``prepare_threshold`` in the alias's ``OPTIONS``) and a connection pooler in
    transaction mode hands each transaction any server session: one that never saw
    the preparation. The error raised is also a Django ``ProgrammingError``.
    """


class HistoryKeyConflict(SelvedgeError):
    """The history key holds another command, or uses a reserved prefix."""


class Fenced(SelvedgeError):
    """Another execution owns the instance: this writer's lease epoch is stale."""


class LeaseLost(SelvedgeError):
    """The execution abandoned its lease because it could not prove it was still valid."""


class NondeterminismError(SelvedgeError):
    """Workflow code issued commands that differ from its recorded history."""

    def __init__(
        self,
        message: str | None = None,
        *,
        instance_id: str = "",
        key: str = "",
        expected: str = "",
        actual: str = "",
    ) -> None:
        self.instance_id = instance_id
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class ReplayOutcomeError(SelvedgeError):
    """The replayed workflow closed differently from its recorded outcome."""

    def __init__(
        self,
        instance_id: str = "",
        recorded_status: str = "",
        replayed_status: str = "",
        recorded: Any = None,
        replayed: Any = None,
    ) -> None:
        self.instance_id = instance_id
        self.recorded_status = recorded_status
        self.replayed_status = replayed_status
        self.recorded = recorded
        self.replayed = replayed
        super().__init__(
            f"instance {instance_id!r} recorded {recorded_status} {recorded!r} "
            f"but replay ended {replayed_status} {replayed!r}"
        )


class ReplayError(SelvedgeError):
    """Replay diverged from the recorded history."""

    def __init__(
        self,
        instance_id: str = "",
        divergence: BaseException | None = None,
        workflow_error: BaseException | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.divergence = divergence
        self.workflow_error = workflow_error
        super().__init__(f"replay of {instance_id!r} diverged: {divergence}")
        self.__cause__ = divergence


class ReplayDecodeError(SelvedgeError):
    """A recorded value could not be decoded."""


class UnsupportedHistoryFormat(SelvedgeError, ValueError):
    """Unsupported history format or version."""


class QueryFailed(SelvedgeError):
    """The query handler failed."""

    def __init__(self, name: str = "", error: BaseException | None = None) -> None:
        self.name = name
        self.error = error
        super().__init__(f"query {name!r} failed: {error}")
        self.__cause__ = error


class QueryNotFound(SelvedgeError, LookupError):
    """No query handler of this name exists at the replay position."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        super().__init__(f"no query handler named {name!r}")


class HistoryKeyNotFound(SelvedgeError, LookupError):
    """The history of the instance records no command at this key or position."""

    def __init__(
        self, instance_id: str = "", at: str | int = "", message: str | None = None
    ) -> None:
        self.instance_id = instance_id
        self.at = at
        super().__init__(
            message
            or f"the history of workflow instance {instance_id!r} records no command at {at!r}"
        )


class QueryCommandError(SelvedgeError):
    """Query handlers may not issue workflow commands."""


class QueryTimeout(SelvedgeError, TimeoutError):
    """The query's replay did not reach its answer within the timeout."""

    def __init__(self, instance_id: str = "", name: str = "", timeout: float = 0.0) -> None:
        self.instance_id = instance_id
        self.name = name
        self.timeout = timeout
        super().__init__(
            f"query {name!r} of {instance_id!r} did not answer within {timeout} seconds"
        )


class ActivityCancelled(SelvedgeError):
    """The activity attempt was cancelled, lost its claim or passed its deadline."""


class NotActivityContext(SelvedgeError):
    """Not inside an activity attempt."""


class StreamClosed(SelvedgeError):
    """The stream is closed: ``ctx.close_stream()`` ended it, or its instance closed."""

    def __init__(self, instance_id: str = "", key: str = "", message: str | None = None) -> None:
        self.instance_id = instance_id
        self.key = key
        if message is None and key:
            message = f"stream {key!r} of {instance_id!r} is closed"
        super().__init__(message)


class StreamLimitExceeded(SelvedgeError):
    """The instance holds MAX_STREAM_ENTRIES stream entries; nothing more is written."""

    def __init__(self, instance_id: str = "", limit: int = 0, message: str | None = None) -> None:
        self.instance_id = instance_id
        self.limit = limit
        if message is None and instance_id:
            message = (
                f"instance {instance_id!r} holds {limit} stream entries, the limit"
                " (MAX_STREAM_ENTRIES)"
            )
        super().__init__(message)


# -- workflow outcomes ------------------------------------------------------------------


class ApplicationError(SelvedgeError):
    """A portable activity or workflow failure."""

    def __init__(
        self,
        message: str = "",
        type: str | None = None,
        details: Any = None,
        non_retryable: bool = False,
    ) -> None:
        self.type = type
        self.details = details
        self.non_retryable = non_retryable
        super().__init__(message)

    def __repr__(self) -> str:
        return f"ApplicationError({self.message!r}, type={self.type!r})"


class ActivityTimeoutError(SelvedgeError, TimeoutError):
    """An activity deadline elapsed.

    ``kind`` is ``schedule_to_start``, ``start_to_close`` or ``heartbeat`` (the
    seeds' three timeouts), or ``claim_lapsed``: the attempt's claim expired
    before any configured deadline because its worker stopped renewing it
    (the process vanished, stalled or lost its database).
    """

    KINDS = ("schedule_to_start", "start_to_close", "heartbeat", "claim_lapsed")

    def __init__(self, activity: str = "", kind: str = "", attempt: int = 0) -> None:
        self.activity = activity
        self.kind = kind
        self.attempt = attempt
        super().__init__(f"activity {activity!r} timed out ({kind}) on attempt {attempt}")


class RetryExhaustedError(SelvedgeError):
    """All retry attempts of the activity have been used."""

    def __init__(
        self, activity: str = "", attempts: int = 0, last_error: BaseException | None = None
    ) -> None:
        self.activity = activity
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(f"activity {activity!r} failed after {attempts} attempts: {last_error}")
        self.__cause__ = last_error


class WorkflowPanicError(SelvedgeError):
    """An activity raised a BaseException that is not an Exception."""


class CompensationError(SelvedgeError):
    """A saga's compensation failed for good after the saga's block had failed.

    ``error`` is what the block raised (the reason the compensations ran);
    ``compensation_errors`` holds each compensation's final failure, in the order
    the compensations ran, and ``compensation_error`` is the first of them.
    """

    def __init__(
        self,
        error: BaseException | None = None,
        compensation_errors: list[BaseException] | tuple[BaseException, ...] = (),
    ) -> None:
        self.error = error
        self.compensation_errors = list(compensation_errors)
        first = self.compensation_errors[0] if self.compensation_errors else None
        count = len(self.compensation_errors)
        more = f" (and {count - 1} more)" if count > 1 else ""
        super().__init__(f"compensation failed: {first}{more}; after: {error}")
        self.__cause__ = first

    @property
    def compensation_error(self) -> BaseException | None:
        """The first compensation that failed for good."""
        return self.compensation_errors[0] if self.compensation_errors else None


class ReceiveTimeout(SelvedgeError, TimeoutError):
    """No signal arrived before the timeout."""


class Cancelled(BaseException):
    """The workflow or one of its scopes was cancelled."""

    def __init__(self, message: str | None = None) -> None:
        if message is None:
            message = (type(self).__doc__ or "cancelled").strip().splitlines()[0]
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class WorkflowCancelled(Cancelled):
    """Cancellation of the workflow was requested."""

    def __init__(self, instance_id: str = "", reason: str = "") -> None:
        self.instance_id = instance_id
        self.reason = reason
        msg = f"workflow {instance_id!r} cancelled"
        if reason:
            msg += f": {reason}"
        super().__init__(msg)


class ScopeCancelled(Cancelled):
    """A local cancellation scope was cancelled."""


class InvalidWorkflowState(SelvedgeError):
    """The operation does not apply to the instance in its current state (a resume or
    fork of a running instance, for one)."""

    def __init__(self, instance_id: str = "", status: str = "", message: str = "") -> None:
        self.instance_id = instance_id
        self.status = status
        super().__init__(message or f"workflow instance {instance_id!r} is {status}")


class WorkflowTerminated(SelvedgeError):
    """An operator terminated the workflow: it was closed as failed without running its code."""

    def __init__(self, instance_id: str = "", reason: str = "") -> None:
        self.instance_id = instance_id
        self.reason = reason
        msg = f"workflow {instance_id!r} terminated"
        if reason:
            msg += f": {reason}"
        super().__init__(msg)
