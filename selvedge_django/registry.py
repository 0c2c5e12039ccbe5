"""Defining and registering workflows and activities.

``@activity(name=...)`` and ``@workflow(name=...)`` wrap plain functions in
definitions and register them in the process-wide registry under their durable
name. Workers dispatch by that name, so it must never change once instances
exist. Registering the same function again is fine; another function under a
taken name raises a conflict error.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Coroutine, Mapping
from datetime import timedelta
from typing import Any, Generic, Never, NoReturn, Protocol, TypeVar, overload

from .engine import commands
from .engine.attributes import AttributeValue
from .engine.context import WorkflowContext as _WorkflowContext
from .engine.coroutines import call_activity, is_async_callable
from .engine.durations import Duration
from .engine.execution import current_execution
from .engine.handles import Future
from .engine.identifiers import name_problem
from .engine.options import ActivityOptions, RetryPolicy
from .exceptions import ActivityNameConflict, WorkflowNameConflict
from .handles import IfExists, WorkflowHandle, client

__all__ = [
    "BUILTIN_PREFIX",
    "ActivityDefinition",
    "WorkflowDefinition",
    "activity",
    "get_activity",
    "get_workflow",
    "is_builtin_workflow",
    "registered_activity_names",
    "registered_workflow_names",
    "workflow",
]

# The names of the app's own workflows (selvedge.prune, selvedge.task): starting one by
# name from the admin or ``runselvedge start`` needs more than starting a workflow.
BUILTIN_PREFIX = "selvedge."
# A definition's input and output types: ActivityDefinition[InT, OutT] wraps a function
# of an InT returning an OutT (awaited first for ``async def``); so does a workflow.
InT = TypeVar("InT", contravariant=True)
OutT = TypeVar("OutT", covariant=True)
In = TypeVar("In")
Out = TypeVar("Out")

_lock = threading.Lock()
_activities: dict[str, ActivityDefinition[Any, Any]] = {}
_workflows: dict[str, WorkflowDefinition[Any, Any]] = {}


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    if a is b:
        return True
    # A module imported twice (autoreload, __main__ vs package) defines equal functions.
    return (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and getattr(a, "__code__", None) is not None
        and getattr(a, "__code__", None).co_code == getattr(b, "__code__", None).co_code  # type: ignore[union-attr]
    )


def _validate_name(name: object, what: str) -> str:
    """The start rule for names (engine.identifiers), raised as ValueError at definition."""
    problem = name_problem(name, f"{what} name")
    if problem is not None:
        raise ValueError(problem)
    return str(name)


class ActivityDefinition(Generic[InT, OutT]):
    """A registered activity: a function of one JSON input (an ``InT``), run with retries."""

    def __init__(
        self,
        fn: Callable[[InT], Any],
        name: str,
        options: ActivityOptions,
        transactional: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name
        self.options = options
        self.transactional = transactional
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<activity {self.name!r}>"

    @overload
    def __call__(self: ActivityDefinition[None, Out], input: None = None) -> Out: ...

    @overload
    def __call__(self, input: InT) -> OutT: ...

    def __call__(self, input: Any = None) -> Any:
        """Call the function directly, outside any workflow (for unit tests).

        An ``async def`` activity runs to completion on an event loop of its own
        (from async code, ``await act.fn(input)`` instead).
        """
        return call_activity(self.fn, input, None)

    @property
    def non_retryable_errors(self) -> tuple[type[BaseException], ...]:
        return self.options.effective_retry_policy().non_retryable_errors

    @overload
    def execute(
        self: ActivityDefinition[None, Out],
        ctx: _WorkflowContext,
        input: None = None,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> Out: ...

    @overload
    def execute(
        self,
        ctx: _WorkflowContext,
        input: InT,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> OutT: ...

    def execute(
        self,
        ctx: _WorkflowContext,
        input: Any = None,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> Any:
        """Issue the activity and wait for its durable outcome (runs inline when it can)."""
        future = self._issue(ctx, input, options, activity_id, inline=True)
        return future.get(ctx)

    @overload
    def execute_async(
        self: ActivityDefinition[None, Out],
        ctx: _WorkflowContext,
        input: None = None,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> Future[Out]: ...

    @overload
    def execute_async(
        self,
        ctx: _WorkflowContext,
        input: InT,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> Future[OutT]: ...

    def execute_async(
        self,
        ctx: _WorkflowContext,
        input: Any = None,
        options: ActivityOptions | None = None,
        activity_id: str | None = None,
    ) -> Future[Any]:
        """Reserve the activity in issue order and return a Future without waiting."""
        return self._issue(ctx, input, options, activity_id, inline=False)

    def _issue(
        self,
        ctx: _WorkflowContext,
        input: Any,
        options: ActivityOptions | None,
        activity_id: str | None,
        *,
        inline: bool,
    ) -> Future[Any]:
        if not isinstance(ctx, _WorkflowContext):
            raise TypeError("the first argument of execute() is the workflow's ctx")
        if options is not None and not isinstance(options, ActivityOptions):
            raise TypeError("options must be an ActivityOptions")
        register_activity(self)
        return commands.issue_activity(
            ctx._execution, ctx._scope, self, input, options, activity_id, inline=inline
        )


class WorkflowDefinition(Generic[InT, OutT]):
    """A registered workflow: a function of (ctx, an ``InT``) replayed from its history."""

    def __init__(self, fn: Callable[[_WorkflowContext, InT], OutT], name: str) -> None:
        self.fn = fn
        self.name = name
        # The activity key of a workflow that, started with that activity already
        # reserved as its only command, returns the activity's result: a worker that
        # records the activity's success closes such an instance (never leased since its
        # start) in the same transaction. Set only by selvedge's own task workflow.
        self.result_activity: str | None = None
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<workflow {self.name!r}>"

    @overload
    def __call__(self: WorkflowDefinition[None, Out], ctx: _WorkflowContext) -> Out: ...

    @overload
    def __call__(self, ctx: _WorkflowContext, input: InT) -> OutT: ...

    def __call__(self, ctx: _WorkflowContext, input: Any = None) -> Any:
        if current_execution() is None:
            raise RuntimeError(
                "a workflow runs under a worker: use selvedge_django.start_workflow()"
            )
        return self.fn(ctx, input)

    @overload
    def start(
        self: WorkflowDefinition[None, Out],
        input: None = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[Out]: ...

    @overload
    def start(
        self,
        input: InT,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[OutT]: ...

    def start(
        self,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[Any]:
        """Start an instance of this workflow and return its handle.

        The options, rules and errors are those of ``start_workflow`` (inside
        ``transaction.atomic()`` the start commits with the caller's transaction);
        ``handle.result()`` has the type this workflow's function returns.
        """
        instance_id = client().start_workflow(
            self.name,
            input,
            instance_id=instance_id,
            execution_timeout=execution_timeout,
            if_exists=if_exists,
            priority=priority,
            attributes=attributes,
        )
        return WorkflowHandle(instance_id)

    @overload
    async def astart(
        self: WorkflowDefinition[None, Out],
        input: None = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[Out]: ...

    @overload
    async def astart(
        self,
        input: InT,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[OutT]: ...

    async def astart(
        self,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> WorkflowHandle[Any]:
        """Async twin of :meth:`start` (``astart_workflow``), for async views."""
        instance_id = await client().astart_workflow(
            self.name,
            input,
            instance_id=instance_id,
            execution_timeout=execution_timeout,
            if_exists=if_exists,
            priority=priority,
            attributes=attributes,
        )
        return WorkflowHandle(instance_id)


def register_activity(definition: ActivityDefinition[Any, Any]) -> None:
    """Register an activity definition, refusing another function under its name."""
    with _lock:
        existing = _activities.get(definition.name)
        if (
            existing is not None
            and existing is not definition
            and not _same_function(existing.fn, definition.fn)
        ):
            raise ActivityNameConflict(
                f"activity name {definition.name!r} is already registered to "
                f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            )
        _activities[definition.name] = definition


def register_workflow(definition: WorkflowDefinition[Any, Any]) -> None:
    """Register a workflow definition, refusing another function under its name."""
    with _lock:
        existing = _workflows.get(definition.name)
        if (
            existing is not None
            and existing is not definition
            and not _same_function(existing.fn, definition.fn)
        ):
            raise WorkflowNameConflict(
                f"workflow name {definition.name!r} is already registered to "
                f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            )
        _workflows[definition.name] = definition


def unregister(name: str, *, kind: str) -> None:
    """Remove a registration (tests that define throwaway workflows use this)."""
    with _lock:
        (_activities if kind == "activity" else _workflows).pop(name, None)


def get_activity(name: str) -> ActivityDefinition[Any, Any] | None:
    return _activities.get(name)


def get_workflow(name: str) -> WorkflowDefinition[Any, Any] | None:
    return _workflows.get(name)


def registered_activity_names() -> list[str]:
    return sorted(_activities)


def registered_workflow_names() -> list[str]:
    return sorted(_workflows)


def is_builtin_workflow(name: str) -> bool:
    """Whether ``name`` is (or would be) one of the app's built-in workflows."""
    return name.startswith(BUILTIN_PREFIX)


class _ActivityDecorator(Protocol):
    """What ``@activity(name=...)`` returns: ``async def`` outputs are the awaited value."""

    @overload
    def __call__(
        self, func: Callable[[In], Coroutine[Any, Any, Out]], /
    ) -> ActivityDefinition[In, Out]: ...

    @overload
    def __call__(self, func: Callable[[In], Out], /) -> ActivityDefinition[In, Out]: ...


@overload
def activity(fn: Never, /) -> NoReturn: ...  # bare @activity: refused, a name is required


@overload
def activity(
    *,
    name: str,
    queue: str = "",
    start_to_close_timeout: float | timedelta | None = None,
    schedule_to_start_timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    transactional: bool = False,
    priority: int | None = None,
    concurrency_key: str | None = None,
    max_concurrency: int | None = None,
) -> _ActivityDecorator: ...


def activity(
    fn: object = None,
    /,
    *,
    name: str | None = None,
    queue: str = "",
    start_to_close_timeout: float | timedelta | None = None,
    schedule_to_start_timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    transactional: bool = False,
    priority: int | None = None,
    concurrency_key: str | None = None,
    max_concurrency: int | None = None,
) -> _ActivityDecorator:
    """Define an activity: ``@activity(name="charge", retry_policy=RetryPolicy(...))``.

    ``name`` is required and durable. The other arguments are the defaults that
    ``execute(..., options=ActivityOptions(...))`` can override field by field
    (``priority``, ``concurrency_key`` and ``max_concurrency``: docs/flow-control.md).
    With ``transactional=True`` the body runs in ``transaction.atomic()`` on the
    engine's database and its outcome commits in that same transaction.
    """
    if fn is not None:
        raise TypeError("@activity needs a durable name: use @activity(name='...')")
    if name is None:
        raise TypeError("@activity needs a durable name: use @activity(name='...')")
    _validate_name(name, "activity")
    options = ActivityOptions(
        queue=queue,
        start_to_close_timeout=start_to_close_timeout,
        schedule_to_start_timeout=schedule_to_start_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retry_policy=retry_policy,
        priority=priority,
        concurrency_key=concurrency_key,
        max_concurrency=max_concurrency,
    )

    def decorate(func: Callable[[Any], Any]) -> ActivityDefinition[Any, Any]:
        if not callable(func):
            raise TypeError("@activity decorates a function")
        if transactional and is_async_callable(func):
            raise TypeError(
                f"activity {name!r} is an async def function and cannot be transactional: "
                "its database calls run on other threads, outside the attempt's transaction"
            )
        definition: ActivityDefinition[Any, Any] = ActivityDefinition(
            func, name, options, transactional=bool(transactional)
        )
        register_activity(definition)
        return definition

    return decorate


def workflow(
    fn: None = None, /, *, name: str | None = None
) -> Callable[[Callable[[_WorkflowContext, In], Out]], WorkflowDefinition[In, Out]]:
    """Define a workflow: ``@workflow(name="order")`` on a function of ``(ctx, input)``."""
    if fn is not None or name is None:
        raise TypeError("@workflow needs a durable name: use @workflow(name='...')")
    _validate_name(name, "workflow")

    def decorate(func: Callable[[_WorkflowContext, In], Out]) -> WorkflowDefinition[In, Out]:
        if not callable(func):
            raise TypeError("@workflow decorates a function")
        if is_async_callable(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"workflow {name!r} is an async def function: a workflow is a plain def "
                "(its waits suspend it by unwinding its frames); keep it synchronous and "
                "put the async code in an async def activity"
            )
        definition = WorkflowDefinition(func, name)
        register_workflow(definition)
        return definition

    return decorate
