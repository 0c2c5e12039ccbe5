"""Bulk starts: ``sv.start_workflows`` and the many-task enqueue of ``django.tasks``.

Every start of the call is validated as :func:`~.instances.start_workflow` validates
one, before anything is written; then the store inserts them all in one
transaction (the caller's ``transaction.atomic()`` when there is one), one statement
per batch and table (``storage.bulk_starts``). The tasks of a many-task enqueue are
validated as the store takes them instead, a batch at a time inside the
transaction, so that their preparation overlaps the database's inserts; a bad one
rolls the call back all the same. Workers are woken, and the start hooks and
signals fire, once, after commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from .. import exceptions as exc
from .. import hooks as hooks_module
from .. import signals
from ..conf import get_settings
from ..engine.attributes import check_attributes
from ..engine.commands import activity_task
from ..engine.durations import execution_timeout_ms
from ..engine.events import CMD_ACTIVITY, HistoryRow
from ..engine.options import ActivityOptions
from ..engine.ports import TaskSpec
from ..registry import ActivityDefinition, WorkflowDefinition
from ..storage.bulk_starts import NewInstance
from .base import client_store, validate_instance_id
from .instances import _check_if_exists, _start_input, _start_name, _start_priority

__all__ = [
    "START_OPTIONS",
    "TaskStart",
    "astart_workflows",
    "start_tasks",
    "start_workflows",
]

#: The options an item of :func:`start_workflows` may carry (those of start_workflow).
START_OPTIONS = frozenset(
    {"instance_id", "execution_timeout", "if_exists", "priority", "attributes"}
)
#: The tasks :func:`start_tasks` hands the store at a time: enough for the statements of
#: one to keep the database busy while the next is prepared, few enough that the first
#: goes out early.
TASK_BATCH = 1000
# The options of a task enqueued without any (never changed).
_NO_OPTIONS: dict[str, Any] = {}


def start_workflows(
    starts: Iterable[
        tuple[WorkflowDefinition[Any, Any] | str, Any]
        | tuple[WorkflowDefinition[Any, Any] | str, Any, Mapping[str, Any] | None]
    ],
) -> list[str]:
    """Start many workflow instances at once; return their ids in the order given.

    Each item is ``(workflow, input)`` or ``(workflow, input, options)``, ``workflow``
    a definition or a name and ``options`` a dict of :func:`start_workflow`'s keyword
    arguments (``instance_id``, ``execution_timeout``, ``if_exists``, ``priority``,
    ``attributes``). Every item is validated first, as a single start is: a bad one
    raises :class:`WorkflowStartRejected` (or, for bad ``attributes``, ``ValueError``)
    naming its position, with nothing written. Then
    all the instances are inserted in one transaction, one statement per batch (as
    many rows as one statement binds): inside ``transaction.atomic()`` they commit or
    roll back with the caller's transaction. A taken id raises
    :class:`WorkflowAlreadyStarted` and nothing of the call is written, unless its
    item says ``if_exists="return"`` and the instance is of the same workflow: then
    its id is returned and that instance is left as it is (its attributes too). An
    id given twice in one call is taken by its first item. The attributes of the new
    instances are inserted in the same transaction, one statement per batch. Workers
    are woken once, after commit.
    """
    items = list(starts)
    new: list[NewInstance] = []
    settings = get_settings()
    codec = client_store().codec
    hooks = settings.hooks
    tracing = getattr(hooks, "trace_context", None) is not None
    # What every start of one workflow shares, validated once: its name, by the
    # definition (or name) given.
    names: dict[int | str, str] = {}
    for index, item in enumerate(items):
        workflow, input, options = _item(index, item)
        if_exists = options.get("if_exists", "fail")
        try:
            _check_if_exists(if_exists)
            named = workflow if isinstance(workflow, str) else id(workflow)
            name = names.get(named)
            if name is None:
                name = names[named] = _start_name(workflow)
            instance_id = options.get("instance_id")
            instance_id = (
                uuid.uuid4().hex if instance_id is None else validate_instance_id(instance_id)
            )
            timeout_ms = execution_timeout_ms(options.get("execution_timeout"))
            text = _start_input(codec, input)
            priority = _start_priority(options.get("priority", 0))
        except exc.WorkflowStartRejected as error:
            raise exc.WorkflowStartRejected(f"start #{index}: {error}") from error
        attributes = options.get("attributes")
        if attributes:  # none given (or an empty value) checks as {}: nothing to write
            try:
                checked = check_attributes(attributes)
            except ValueError as error:
                raise ValueError(f"start #{index}: {error}") from error
            attributes = {k: v for k, v in checked.items() if v is not None}
        else:
            attributes = None
        new.append(
            NewInstance(
                instance_id=instance_id,
                workflow_name=name,
                input_value=None,
                input_text=text,
                if_exists=if_exists,
                execution_timeout_ms=timeout_ms,
                trace_context=_trace_context(hooks, tracing, instance_id, name),
                priority=priority,
                attributes=attributes,
            )
        )
    _check_repeated(new)
    _create(new)
    return [start.instance_id for start in new]


async def astart_workflows(
    starts: Iterable[
        tuple[WorkflowDefinition[Any, Any] | str, Any]
        | tuple[WorkflowDefinition[Any, Any] | str, Any, Mapping[str, Any] | None]
    ],
) -> list[str]:
    """Async twin of :func:`start_workflows`."""
    return await sync_to_async(start_workflows)(list(starts))


class TaskStart:
    """One enqueued ``django.tasks`` task for :func:`start_tasks`: its workflow input
    (whose ``"options"`` are the activity's), instance id, priority, enqueue time, and
    whether it waits for ``run_after``."""

    __slots__ = ("deferred", "enqueued_at", "input", "instance_id", "priority")

    def __init__(
        self,
        input: dict[str, Any],
        *,
        instance_id: str,
        priority: int,
        enqueued_at: datetime,
        deferred: bool,
    ) -> None:
        self.input = input
        self.instance_id = instance_id
        self.priority = priority
        self.enqueued_at = enqueued_at
        self.deferred = deferred


def start_tasks(
    workflow: WorkflowDefinition[Any, Any],
    activity: ActivityDefinition[Any, Any],
    tasks: Iterable[TaskStart],
) -> None:
    """Start the instances of many enqueued tasks in one transaction (the bulk form of
    ``tasks.runner.start_task``): a task due now with its activity reserved, as
    :func:`~.instances.start_with_activity` does, a deferred one as a plain start.
    Validation and errors are those of :func:`start_workflows`, and every id must be
    new.

    ``tasks`` is read as the store takes the starts, :data:`TASK_BATCH` at a time,
    inside the transaction: a generator's work on one batch overlaps the database's
    on the last (on PostgreSQL), and an error anywhere rolls the whole call back.
    """
    key = workflow.result_activity
    if key is None:
        raise ValueError(f"workflow {workflow.name!r} has no result_activity")
    settings = get_settings()
    codec = client_store().codec
    hooks = settings.hooks
    tracing = getattr(hooks, "trace_context", None) is not None
    try:
        name = _start_name(workflow)
    except exc.WorkflowStartRejected as error:
        raise exc.WorkflowStartRejected(f"task #0: {error}") from error
    # Tasks of one function share their options (often one object): the options are
    # resolved, and the reservation and task built, once per distinct set.
    resolved: dict[str, tuple[HistoryRow, TaskSpec]] = {}
    by_object: dict[int, tuple[HistoryRow, TaskSpec]] = {}
    started: list[str] = []

    def new_instance(index: int, task: TaskStart) -> NewInstance:
        try:
            instance_id = validate_instance_id(task.instance_id)
            text = _start_input(codec, task.input)
            priority = _start_priority(task.priority)
        except exc.WorkflowStartRejected as error:
            raise exc.WorkflowStartRejected(f"task #{index}: {error}") from error
        first = None
        if not task.deferred:
            raw = task.input.get("options") or _NO_OPTIONS
            template = by_object.get(id(raw))
            if template is None:
                options_key = json.dumps(raw, sort_keys=True, default=str)
                template = resolved.get(options_key)
                if template is None:
                    options = activity.options.merged(ActivityOptions.from_json(raw))
                    reservation, spec = activity_task(activity.name, name, text, options)
                    row = HistoryRow(key=key, seq=1, command=CMD_ACTIVITY, reservation=reservation)
                    template = resolved[options_key] = (row, spec)
                # The options object lives as long as the task's input: its id is its own.
                by_object[id(raw)] = template
            first = template
        started.append(instance_id)
        return NewInstance(
            instance_id=instance_id,
            workflow_name=name,
            input_value=None,
            input_text=text,
            trace_context=_trace_context(hooks, tracing, instance_id, name),
            priority=priority,
            started_at=task.enqueued_at,
            first_task=first,
            # The activity's input is the workflow's (the shared spec's is the first's).
            task_input=None if first is None else text,
        )

    def batches() -> Iterator[list[NewInstance]]:
        seen: dict[str, NewInstance] = {}
        batch: list[NewInstance] = []
        for index, task in enumerate(tasks):
            batch.append(new_instance(index, task))
            if len(batch) == TASK_BATCH:
                _check_repeated(batch, seen)
                yield batch
                batch = []
        if batch:
            _check_repeated(batch, seen)
            yield batch

    store = client_store()
    store.bulk_starts.create_new_instances(
        batches(), service_name=settings.service_name, code_version=settings.code_version
    )
    _fire_started_on_commit([(instance_id, name) for instance_id in started])


def _item(index: int, item: Any) -> tuple[Any, Any, Mapping[str, Any]]:
    """An item of start_workflows as (workflow, input, options), or WorkflowStartRejected."""
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise exc.WorkflowStartRejected(
            f"start #{index}: each start is (workflow, input) or (workflow, input, options),"
            f" not {type(item).__name__}"[:300]
        )
    workflow, input = item[0], item[1]
    options = item[2] if len(item) == 3 else None
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise exc.WorkflowStartRejected(
            f"start #{index}: options must be a dict, not {type(options).__name__}"[:300]
        )
    unknown = sorted(str(key) for key in options if key not in START_OPTIONS)
    if unknown:
        raise exc.WorkflowStartRejected(
            f"start #{index}: unknown option(s) {', '.join(unknown)}; a start takes"
            f" {', '.join(sorted(START_OPTIONS))}"[:300]
        )
    if not isinstance(workflow, (WorkflowDefinition, str)):
        raise exc.WorkflowStartRejected(
            f"start #{index}: the workflow is a definition or a name,"
            f" not {type(workflow).__name__}"[:300]
        )
    return workflow, input, options


def _trace_context(hooks: Any, tracing: bool, instance_id: str, name: str) -> str | None:
    """The trace context a start records (None when no hook captures one)."""
    if not tracing:
        return None
    return hooks_module.capture_trace_context(
        hooks, "start", instance_id=instance_id, workflow_name=name
    )


def _check_repeated(
    new: Sequence[NewInstance], first: dict[str, NewInstance] | None = None
) -> None:
    """An id given twice: the later item must accept the earlier one's instance.

    ``first``: the first start of each id in earlier batches of the call (this one's
    are added)."""
    if first is None:
        first = {}
    for start in new:
        earlier = first.setdefault(start.instance_id, start)
        if earlier is start:
            continue
        if start.if_exists != "return" or earlier.workflow_name != start.workflow_name:
            raise exc.WorkflowAlreadyStarted(start.instance_id)


def _create(new: list[NewInstance]) -> None:
    """Insert ``new`` (one transaction); fire the start hooks and signals after commit."""
    if not new:
        return
    store = client_store()
    settings = get_settings()
    created = store.bulk_starts.create_instances(
        new, service_name=settings.service_name, code_version=settings.code_version
    )
    pairs = zip(new, created, strict=True)
    _fire_started_on_commit(
        [(start.instance_id, start.workflow_name) for start, made in pairs if made]
    )


def _fire_started_on_commit(started: list[tuple[str, str]]) -> None:
    """Fire the start hooks and signals of ``started`` (id, workflow) after commit."""
    if not started:
        return
    store = client_store()
    hooks = get_settings().hooks

    def fire() -> None:
        # Nothing listening (the usual bulk start): no event to build for each start.
        event = "on_workflow_started"
        if not (hooks_module.listened(hooks, event) or signals.has_receivers(event)):
            return
        for instance_id, name in started:
            hooks_module.fire(
                hooks, "on_workflow_started", instance_id=instance_id, workflow_name=name
            )
            signals.send("on_workflow_started", instance_id=instance_id, workflow_name=name)

    transaction.on_commit(fire, using=store.alias)
