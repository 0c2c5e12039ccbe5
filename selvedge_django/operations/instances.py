"""Writes on instances: start, signal, cancel and terminate.

Each validates its input before anything is written, joins the caller's
``transaction.atomic()`` when there is one, and wakes workers (and fires the
start or failure hooks) only after commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction

from .. import exceptions as exc
from .. import hooks as hooks_module
from .. import signals
from ..conf import SelvedgeSettings, get_settings
from ..engine.attributes import AttributeValue, check_attributes
from ..engine.codec import Codec, contains_nul
from ..engine.commands import activity_task
from ..engine.durations import Duration, execution_timeout_ms
from ..engine.events import CMD_ACTIVITY, HistoryRow, error_data
from ..engine.identifiers import check_workflow_name, valid_channel
from ..engine.options import ActivityOptions, check_priority
from ..engine.ports import ExecutionSnapshot
from ..handles import IF_EXISTS, IfExists
from ..models import WorkflowStatus
from ..registry import ActivityDefinition, WorkflowDefinition, get_workflow
from ..worker.handoff import local_worker
from .base import client_store, known_id, reason_text, validate_instance_id

__all__ = [
    "acancel_workflow",
    "asignal",
    "asignal_with_start",
    "astart_workflow",
    "aterminate_workflow",
    "cancel_workflow",
    "signal",
    "signal_with_start",
    "start_workflow",
    "terminate_workflow",
]

In = TypeVar("In")


def _leases_version(settings: SelvedgeSettings, version: str | None) -> bool:
    """Whether a worker with ``settings`` leases instances recorded under ``version``."""
    return settings.compatible_versions is None or version in settings.compatible_versions


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[In, object],
    input: In,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[None, object],
    input: None = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str: ...


def start_workflow(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str:
    """Create a workflow instance and return its id.

    Starting by name needs no local registration. Inside ``transaction.atomic()``
    the start commits or rolls back with the caller's transaction, and workers are
    woken only after commit. A taken id raises :class:`WorkflowAlreadyStarted`; an
    invalid id, unencodable input or a bad ``execution_timeout`` raises
    :class:`WorkflowStartRejected` with nothing written.

    ``execution_timeout`` (seconds or a timedelta, positive, at most 100 years)
    bounds the run: still running that long after the start (database clock),
    the leader terminates it as :func:`terminate_workflow` does, with the reason
    ``"execution timeout"``.

    ``if_exists="return"`` makes a start idempotent: when ``instance_id`` is taken
    by an instance of the same workflow (running or closed), nothing is written
    and that id is returned; an instance of another workflow still raises
    :class:`WorkflowAlreadyStarted`. The database's unique key decides, so of
    racing starts with one id exactly one creates the instance.

    ``priority`` (a whole number from -100 to 100, default 0) orders dispatch:
    larger first, then the oldest; each minute an instance waits counts as one
    more point, so a lower priority is delayed, never starved (docs/flow-control.md).

    ``attributes`` are the instance's first search attributes (docs/attributes.md):
    names of 1 to 64 characters of ``[a-z0-9_]``, values ``str`` (at most 255
    characters), ``int``, ``float``, ``bool`` or aware ``datetime`` (``None`` values are
    left out). A bad name or value raises ``ValueError`` with nothing written; they are
    inserted in the start's transaction and found by ``find_instances(attributes=...)``.
    """
    return start_at(
        workflow_or_name,
        input,
        instance_id=instance_id,
        execution_timeout=execution_timeout,
        if_exists=if_exists,
        priority=priority,
        attributes=attributes,
    )


def start_at(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    started_at: datetime | None = None,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str:
    """:func:`start_workflow`, recording ``started_at`` (default: now) as the start
    time, so that a caller can report the start exactly as it is stored."""
    name, instance_id, text, timeout_ms = _start_parts(
        workflow_or_name, input, instance_id, execution_timeout, if_exists
    )
    priority = _start_priority(priority)
    checked = {k: v for k, v in check_attributes(attributes or {}).items() if v is not None}
    store = client_store()
    settings = get_settings()
    # A worker running in this process takes the instance straight from the start.
    worker = local_worker(store.identity) if get_workflow(name) is not None else None
    if worker is not None and not _leases_version(worker.settings, settings.code_version):
        worker = None  # a version-pinned worker that does not take this version
    hooks = settings.hooks
    trace = hooks_module.capture_trace_context(
        hooks, "start", instance_id=instance_id, workflow_name=name
    )
    result = store.starts.create_instance(
        instance_id,
        name,
        json.loads(text),
        service_name=settings.service_name,
        lease_owner=None if worker is None else worker.worker_id,
        lease_ttl=None if worker is None else worker.settings.lease.ttl,
        code_version=settings.code_version,
        execution_timeout_ms=timeout_ms,
        if_exists=if_exists,
        trace_context=trace,
        priority=priority,
        started_at=started_at,
        attributes=checked,
    )
    if not result.created:
        return instance_id  # if_exists="return": the instance of that id, left as it is
    fence, leased_at = result.fence, result.leased_at  # after any wait for the database
    _started_on_commit(store, settings, instance_id, name)
    if worker is not None and fence is not None and leased_at is not None:
        snapshot = ExecutionSnapshot(instance_id, name, json.loads(text), WorkflowStatus.RUNNING)
        transaction.on_commit(
            lambda: worker.run_local_start(fence, snapshot, leased_at), using=store.alias
        )
    return instance_id


def start_with_activity(
    workflow: WorkflowDefinition[Any, Any],
    input: Any,
    activity: ActivityDefinition[Any, Any],
    options: ActivityOptions,
    *,
    instance_id: str,
    priority: int = 0,
    started_at: datetime | None = None,
) -> str:
    """Start ``workflow`` with its first command recorded: ``activity`` on ``input``.

    For a workflow whose code begins with ``activity.execute(ctx, input,
    options=options, activity_id=workflow.result_activity)``: the instance, that
    activity's history reservation and its queued task commit together (inside the
    caller's ``transaction.atomic()`` when there is one), exactly as the workflow's
    first execution would have recorded them, so no worker leases the instance to
    issue it. The attempt that succeeds closes the instance (storage.sole_activity);
    anything else wakes it and the replay goes on from the recorded command.
    Validation and errors are those of :func:`start_workflow`; ``started_at`` is
    that of :func:`start_at`.
    """
    key = workflow.result_activity
    if key is None:
        raise ValueError(f"workflow {workflow.name!r} has no result_activity")
    name, instance_id, text, _ = _start_parts(workflow, input, instance_id, None, "fail")
    priority = _start_priority(priority)
    reservation, task = activity_task(activity.name, name, text, activity.options.merged(options))
    row = HistoryRow(key=key, seq=1, command=CMD_ACTIVITY, reservation=reservation)
    store = client_store()
    settings = get_settings()
    trace = hooks_module.capture_trace_context(
        settings.hooks, "start", instance_id=instance_id, workflow_name=name
    )
    store.starts.create_instance(
        instance_id,
        name,
        json.loads(text),
        service_name=settings.service_name,
        code_version=settings.code_version,
        trace_context=trace,
        priority=priority,
        first_task=(row, task),
        started_at=started_at,
    )
    _started_on_commit(store, settings, instance_id, name)
    return instance_id


def _start_priority(priority: int) -> int:
    """A start's priority, validated (WorkflowStartRejected otherwise, nothing written)."""
    try:
        return check_priority(priority)
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(str(error)) from error


def _start_parts(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any,
    instance_id: str | None,
    execution_timeout: Duration | None,
    if_exists: str,
) -> tuple[str, str, str, int | None]:
    """Validate a start before anything is written: (name, id, input JSON, timeout ms)."""
    _check_if_exists(if_exists)
    name = _start_name(workflow_or_name)
    instance_id = uuid.uuid4().hex if instance_id is None else validate_instance_id(instance_id)
    timeout_ms = execution_timeout_ms(execution_timeout)
    return name, instance_id, _start_input(client_store().codec, input), timeout_ms


def _check_if_exists(if_exists: str) -> None:
    """WorkflowStartRejected unless ``if_exists`` is one of IF_EXISTS."""
    if if_exists not in IF_EXISTS:
        raise exc.WorkflowStartRejected(
            f"if_exists must be one of {', '.join(map(repr, IF_EXISTS))}, not {if_exists!r}"[:300]
        )


def _start_name(workflow_or_name: WorkflowDefinition[Any, Any] | str) -> str:
    """The workflow name of a start, validated (WorkflowStartRejected otherwise)."""
    return check_workflow_name(
        workflow_or_name.name
        if isinstance(workflow_or_name, WorkflowDefinition)
        else workflow_or_name
    )


def _start_input(codec: Codec, input: Any) -> str:
    """The stored JSON text of a start's input (WorkflowStartRejected if it cannot be)."""
    try:
        text = codec.encode(input, "workflow input")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
        raise exc.WorkflowStartRejected(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(f"workflow input is not JSON-encodable: {error}") from error
    if contains_nul(text):
        raise exc.WorkflowStartRejected("workflow input contains a NUL character (\\u0000)")
    return text


def _started_on_commit(store: Any, settings: SelvedgeSettings, instance_id: str, name: str) -> None:
    """Fire the start hook and signal once the start has committed."""
    hooks = settings.hooks

    def started() -> None:
        hooks_module.fire(hooks, "on_workflow_started", instance_id=instance_id, workflow_name=name)
        signals.send("on_workflow_started", instance_id=instance_id, workflow_name=name)

    transaction.on_commit(started, using=store.alias)


def signal(
    instance_id: str, channel: str, payload: Any = None, *, idempotency_key: str | None = None
) -> None:
    """Append ``payload`` to the instance's ``channel`` inbox and wake it.

    Accepted from creation until close, also while an execution holds the lease.
    Inside ``transaction.atomic()`` it commits with the caller. The channel must
    be 1 to 255 UTF-8 bytes (:class:`InvalidSignalChannel`) and the payload JSON
    (:class:`InvalidSignalPayload`); an instance that already holds
    ``MAX_PENDING_SIGNALS`` unconsumed signals refuses it (:class:`InboxFull`).
    Nothing is written otherwise.

    With ``idempotency_key`` (1 to 255 characters, no control characters) a
    second signal with the same key to the same instance is accepted and writes
    nothing: no second inbox entry, no second wake-up, whatever its channel or
    payload. A unique index decides, so racing senders of one key deliver it once.
    """
    store = client_store()
    text = _signal_text(store, channel, payload)
    key = _idempotency_key(idempotency_key)
    known_id(instance_id)
    settings = get_settings()
    trace = hooks_module.capture_trace_context(
        settings.hooks, "signal", instance_id=instance_id, workflow_name="", key=channel
    )
    store.waits.append_signal(
        instance_id,
        channel,
        text,
        max_pending=settings.max_pending_signals,
        idempotency_key=key,
        trace_context=trace,
    )


@overload
def signal_with_start(
    workflow_or_name: WorkflowDefinition[In, object],
    input: In,
    *,
    instance_id: str,
    channel: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    execution_timeout: Duration | None = None,
) -> str: ...


@overload
def signal_with_start(
    workflow_or_name: str,
    input: Any = None,
    *,
    instance_id: str,
    channel: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    execution_timeout: Duration | None = None,
) -> str: ...


def signal_with_start(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str,
    channel: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    execution_timeout: Duration | None = None,
) -> str:
    """Start the instance unless it exists, and append the signal, in one transaction.

    The start follows :func:`start_workflow`'s rules (``instance_id`` is
    required; an existing instance of the same workflow, running, is signalled;
    one of another workflow raises :class:`WorkflowAlreadyStarted`), the signal
    :func:`signal`'s (a closed instance raises :class:`InstanceClosed`,
    ``idempotency_key`` makes a repeated signal a no-op). Everything is
    validated before anything is written, and a refused signal leaves no
    instance behind. Racing callers make exactly one instance and deliver every
    signal once. Returns the instance id.
    """
    if instance_id is None:
        raise exc.WorkflowStartRejected("signal_with_start needs an instance_id")
    name, instance_id, text, timeout_ms = _start_parts(
        workflow_or_name, input, instance_id, execution_timeout, "return"
    )
    store = client_store()
    signal_text = _signal_text(store, channel, payload)
    key = _idempotency_key(idempotency_key)
    settings = get_settings()
    trace = hooks_module.capture_trace_context(
        settings.hooks, "start", instance_id=instance_id, workflow_name=name
    )
    created = store.signal_with_start(
        instance_id,
        name,
        json.loads(text),
        channel,
        signal_text,
        service_name=settings.service_name,
        code_version=settings.code_version,
        execution_timeout_ms=timeout_ms,
        max_pending=settings.max_pending_signals,
        idempotency_key=key,
        trace_context=trace,
    )
    if created:
        _started_on_commit(store, settings, instance_id, name)
    return instance_id


def _signal_text(store: Any, channel: str, payload: Any) -> str:
    """Validate a signal's channel and encode its payload, before anything is written."""
    if not valid_channel(channel):
        raise exc.InvalidSignalChannel(
            f"signal channel must contain 1 to 255 UTF-8 bytes and no NUL, not {channel!r}"[:300]
        )
    try:
        text: str = store.codec.encode(payload, "signal payload")
    except exc.PayloadTooLarge:
        raise
    except exc.PayloadTooDeep as error:
        raise exc.InvalidSignalPayload(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.InvalidSignalPayload(f"signal payload is not JSON-encodable: {error}") from error
    return text


def _idempotency_key(key: object) -> str | None:
    """A signal's idempotency key: None, or 1 to 255 characters without control characters."""
    if key is None:
        return None
    if (
        not isinstance(key, str)
        or not 1 <= len(key) <= 255
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in key)
    ):
        raise exc.InvalidSignalPayload(
            "idempotency_key must be a string of 1 to 255 characters without control"
            f" characters, not {key!r}"[:300]
        )
    return key


def cancel_workflow(instance_id: str, reason: str = "") -> None:
    """Durably request cancellation of an instance and wake it.

    Completed or failed instances raise an :class:`InstanceClosed` subclass; an
    already cancelled instance is fine. The workflow observes the request at its
    next blocking wait.
    """
    instance_id, reason = known_id(instance_id), reason_text(reason)
    trace = hooks_module.capture_trace_context(
        get_settings().hooks, "cancel", instance_id=instance_id, workflow_name=""
    )
    client_store().cancels.request_cancel(instance_id, reason, trace_context=trace)


def terminate_workflow(instance_id: str, reason: str = "") -> None:
    """Close a running instance at once as failed, without running its code.

    Its error is :class:`WorkflowTerminated` (``instance_id``, ``reason``). In one
    transaction the lease epoch moves on (a worker still running the instance is
    fenced out at its next write), unfinished activity tasks are cancelled (a
    running attempt loses its claim and its late result is discarded), timers are
    deleted and running children are asked to cancel; a waiting parent receives
    the failure. The history rows still waiting for a value are left as they were,
    the close row alone records the terminate. Closed instances raise
    :class:`InstanceClosed` (a subclass naming the status); unknown ids
    :class:`WorkflowNotFound`. Inside ``transaction.atomic()`` it commits with the
    caller.
    """
    reason = reason_text(reason)
    instance_id = known_id(instance_id)
    store = client_store()
    error = exc.WorkflowTerminated(instance_id, reason)
    envelope = error_data(error, codec=store.codec)
    name = store.instances.terminate(instance_id, envelope, {"terminate": {"reason": reason}})
    hooks = get_settings().hooks

    def terminated() -> None:
        fields = dict(instance_id=instance_id, workflow_name=name, error=error, duration=0.0)
        hooks_module.fire(hooks, "on_workflow_failed", **fields)
        signals.send("on_workflow_failed", **fields)

    transaction.on_commit(terminated, using=store.alias)


@overload
async def astart_workflow(
    workflow_or_name: WorkflowDefinition[In, object],
    input: In,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str: ...


@overload
async def astart_workflow(
    workflow_or_name: WorkflowDefinition[None, object],
    input: None = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str: ...


@overload
async def astart_workflow(
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
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
    if_exists: IfExists = "fail",
    priority: int = 0,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> str:
    """Async twin of :func:`start_workflow`, with its overloads (by definition or by name)."""
    # The implementation's signature: no single overload takes the union.
    start: Callable[..., str] = start_workflow
    return await sync_to_async(start)(
        workflow_or_name,
        input,
        instance_id=instance_id,
        execution_timeout=execution_timeout,
        if_exists=if_exists,
        priority=priority,
        attributes=attributes,
    )


asignal = sync_to_async(signal)
asignal_with_start = sync_to_async(signal_with_start)
acancel_workflow = sync_to_async(cancel_workflow)
aterminate_workflow = sync_to_async(terminate_workflow)
