"""Handles: the client's typed view of one workflow instance, and the records it reads.

A :class:`WorkflowHandle` names an instance by its id and carries the output type of
its workflow, so ``handle.result()`` has the type the workflow function returns.
``WorkflowDefinition.start()`` and ``selvedge_django.get_handle()`` make them.

A handle's calls are the operations layer's (start, wait, describe, signal, cancel,
query), which sits above the definitions: that layer installs itself as the
:class:`HandleClient` when the app is ready (:func:`install_client`), as the store's
``on_closed`` callback is installed from above. The records those calls return,
:class:`WorkflowResult` and :class:`WorkflowDescription`, live here with the handle
(the operations layer re-exports them under their old import paths). This module
imports no models: the package imports it at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, Protocol, TypeVar

from . import exceptions as exc
from .engine.attributes import AttributeValue
from .engine.codec import error_to_envelope
from .engine.durations import Duration

__all__ = [
    "IF_EXISTS",
    "HandleClient",
    "IfExists",
    "WorkflowDescription",
    "WorkflowHandle",
    "WorkflowResult",
    "client",
    "install_client",
]

# What a start does when its instance id is taken.
IfExists = Literal["fail", "return"]
IF_EXISTS: tuple[str, ...] = ("fail", "return")

# A handle's result type: the output of its workflow (only ever returned, so covariant:
# a handle of a workflow returning bool is a handle of one returning int).
R = TypeVar("R", covariant=True)


@dataclass(frozen=True)
class WorkflowResult:
    """The current result of an instance: ``output`` when completed, ``error`` otherwise."""

    instance_id: str
    status: str
    output: Any = None
    error: BaseException | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the result as JSON-safe data (the error as its envelope, no traceback)."""
        return {
            "instance_id": self.instance_id,
            "status": self.status,
            "output": self.output,
            "error": None
            if self.error is None
            else error_to_envelope(self.error, with_traceback=False),
        }


@dataclass(frozen=True)
class WorkflowDescription:
    """Durable status and links of one instance."""

    instance_id: str
    workflow_name: str
    status: str
    cancel_requested: bool
    cancel_reason: str
    parent_instance_id: str
    parent_key: str
    started_at: datetime
    updated_at: datetime
    # Executions in a row that ended on a storage error, and the last such error: the
    # instance is held back from dispatch, longer after each (0 and "" otherwise).
    execution_errors: int = 0
    execution_error: str = ""
    # History generations from 1 (a resume starts the next), how many resumes, and the
    # instance this one was forked from (None when it was not).
    generation: int = 1
    resumed_count: int = 0
    forked_from: str | None = None
    # SELVEDGE["CODE_VERSION"] of the process that started it (None: unset there).
    code_version: str | None = None
    # The execution timeout it was started (or forked) with, and when the leader
    # terminates it if it is still running then (database clock); None: no timeout.
    execution_timeout: timedelta | None = None
    execution_deadline: datetime | None = None
    # The last value the workflow gave ctx.set_progress() (None: none), read without a
    # replay.
    progress: Any = None
    # The dispatch priority it was started with (-100 to 100, larger first).
    priority: int = 0
    # Its search attributes by name (start_workflow(attributes=), ctx.set_attributes).
    attributes: dict[str, Any] = field(default_factory=dict)
    # Whether an operator paused it (sv.pause_workflow), why, and since when.
    paused: bool = False
    paused_reason: str = ""
    paused_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "workflow_name": self.workflow_name,
            "status": self.status,
            "cancel_requested": self.cancel_requested,
            "cancel_reason": self.cancel_reason,
            "parent_instance_id": self.parent_instance_id,
            "parent_key": self.parent_key,
            "started_at": self.started_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "execution_errors": self.execution_errors,
            "execution_error": self.execution_error,
            "generation": self.generation,
            "resumed_count": self.resumed_count,
            "forked_from": self.forked_from,
            "code_version": self.code_version,
            "execution_timeout": (
                None if self.execution_timeout is None else self.execution_timeout.total_seconds()
            ),
            "execution_deadline": (
                None if self.execution_deadline is None else self.execution_deadline.isoformat()
            ),
            "progress": self.progress,
            "priority": self.priority,
            "attributes": {
                name: value.isoformat() if isinstance(value, datetime) else value
                for name, value in self.attributes.items()
            },
            "paused": self.paused,
            "paused_reason": self.paused_reason,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
        }


class HandleClient(Protocol):
    """The client calls a handle makes (the operations layer provides them)."""

    def start_workflow(
        self,
        workflow_or_name: str,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> str: ...

    async def astart_workflow(
        self,
        workflow_or_name: str,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> str: ...

    def wait_workflow(self, instance_id: str, timeout: float | None = None) -> WorkflowResult: ...

    async def await_workflow(
        self, instance_id: str, timeout: float | None = None
    ) -> WorkflowResult: ...

    def describe(self, instance_id: str) -> WorkflowDescription: ...

    async def adescribe(self, instance_id: str) -> WorkflowDescription: ...

    def signal(
        self,
        instance_id: str,
        channel: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
    ) -> None: ...

    async def asignal(
        self,
        instance_id: str,
        channel: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
    ) -> None: ...

    def cancel_workflow(self, instance_id: str, reason: str = "") -> None: ...

    async def acancel_workflow(self, instance_id: str, reason: str = "") -> None: ...

    def query(
        self,
        instance_id: str,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        at: str | int | None = None,
    ) -> Any: ...

    async def aquery(
        self,
        instance_id: str,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        at: str | int | None = None,
    ) -> Any: ...


_client: HandleClient | None = None


def install_client(calls: HandleClient) -> None:
    """Make ``calls`` the client of every handle (the app does this when it is ready)."""
    global _client
    _client = calls


def client() -> HandleClient:
    """The installed client; a RuntimeError before the app is ready."""
    if _client is None:
        raise RuntimeError(
            "workflow handles need the selvedge_django app: add it to INSTALLED_APPS "
            "and use them once Django is set up"
        )
    return _client


class WorkflowHandle(Generic[R]):
    """One workflow instance, by id, typed by the output of its workflow.

    Made by ``WorkflowDefinition.start()``/``astart()`` and
    :func:`selvedge_django.get_handle`; making one reads nothing. Each call is the
    client call of the same name on :attr:`id`, with its errors (an unknown id:
    :class:`WorkflowNotFound`).
    """

    __slots__ = ("id",)

    def __init__(self, instance_id: str) -> None:
        self.id = instance_id

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash((WorkflowHandle, self.id))

    def result(self, timeout: float | None = None) -> R:
        """Wait for the instance to close and return its output, or raise its error.

        A failed run raises its rebuilt error (an :class:`ApplicationError`, a
        :class:`WorkflowTerminated` ...), a cancelled one :class:`WorkflowCancelled`;
        ``TimeoutError`` when ``timeout`` seconds pass first (as ``wait_workflow``).
        """
        return _outcome(client().wait_workflow(self.id, timeout))

    async def aresult(self, timeout: float | None = None) -> R:
        """Async twin of :meth:`result`: waits without blocking the event loop."""
        return _outcome(await client().await_workflow(self.id, timeout))

    def describe(self) -> WorkflowDescription:
        """Return the instance's durable status and links (``describe``)."""
        return client().describe(self.id)

    async def adescribe(self) -> WorkflowDescription:
        """Async twin of :meth:`describe`."""
        return await client().adescribe(self.id)

    def signal(
        self, channel: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> None:
        """Send ``payload`` on ``channel`` to the instance (``signal``)."""
        client().signal(self.id, channel, payload, idempotency_key=idempotency_key)

    async def asignal(
        self, channel: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> None:
        """Async twin of :meth:`signal`."""
        await client().asignal(self.id, channel, payload, idempotency_key=idempotency_key)

    def cancel(self, reason: str = "") -> None:
        """Request the instance's cancellation (``cancel_workflow``)."""
        client().cancel_workflow(self.id, reason)

    async def acancel(self, reason: str = "") -> None:
        """Async twin of :meth:`cancel`."""
        await client().acancel_workflow(self.id, reason)

    def query(
        self,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        at: str | int | None = None,
    ) -> Any:
        """Answer the query handler ``name`` from one snapshot replay (``query``); with
        ``at`` (a history key or position) as of that step."""
        return client().query(self.id, name, timeout=timeout, at=at)

    async def aquery(
        self,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        at: str | int | None = None,
    ) -> Any:
        """Async twin of :meth:`query`."""
        return await client().aquery(self.id, name, timeout=timeout, at=at)


def _outcome(result: WorkflowResult) -> Any:
    """A closed instance's output, or its error raised."""
    if result.status == "completed":
        return result.output
    if result.error is not None:
        raise result.error
    raise exc.InvalidWorkflowState(
        result.instance_id,
        result.status,
        f"workflow {result.instance_id!r} closed as {result.status} without an error",
    )
