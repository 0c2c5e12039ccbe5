"""Writes on instances: start, signal, cancel and terminate.

Each validates its input before anything is written, joins the caller's
``transaction.atomic()`` when there is one, and wakes workers (and fires the
start or failure hooks) only after commit.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction

from .. import exceptions as exc
from .. import hooks as hooks_module
from .. import signals
from ..conf import SelvedgeSettings, get_settings
from ..engine.codec import contains_nul
from ..engine.durations import Duration, execution_timeout_ms
from ..engine.events import error_data
from ..engine.identifiers import check_workflow_name, valid_channel
from ..engine.ports import ExecutionSnapshot
from ..models import WorkflowStatus
from ..registry import WorkflowDefinition, get_workflow
from ..worker.handoff import local_worker
from .base import client_store, known_id, reason_text, validate_instance_id

__all__ = [
    "acancel_workflow",
    "asignal",
    "astart_workflow",
    "aterminate_workflow",
    "cancel_workflow",
    "signal",
    "start_workflow",
    "terminate_workflow",
]

In = TypeVar("In")


def _leases_version(settings: SelvedgeSettings, version: str | None) -> bool:
    """Whether a worker with ``settings`` leases instances recorded under ``version``."""
    return settings.compatible_versions is None or version in settings.compatible_versions


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[In, Any],
    input: In,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[None, Any],
    input: None = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
) -> str: ...


def start_workflow(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str | None = None,
    execution_timeout: Duration | None = None,
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
    """
    name = check_workflow_name(
        workflow_or_name.name
        if isinstance(workflow_or_name, WorkflowDefinition)
        else workflow_or_name
    )
    instance_id = uuid.uuid4().hex if instance_id is None else validate_instance_id(instance_id)
    timeout_ms = execution_timeout_ms(execution_timeout)
    store = client_store()
    try:
        text = store.codec.encode(input, "workflow input")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
        raise exc.WorkflowStartRejected(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(f"workflow input is not JSON-encodable: {error}") from error
    if contains_nul(text):
        raise exc.WorkflowStartRejected("workflow input contains a NUL character (\\u0000)")
    settings = get_settings()
    # A worker running in this process takes the instance straight from the start.
    worker = local_worker(store.identity) if get_workflow(name) is not None else None
    if worker is not None and not _leases_version(worker.settings, settings.code_version):
        worker = None  # a version-pinned worker that does not take this version
    hooks = settings.hooks
    trace = hooks_module.capture_trace_context(
        hooks, "start", instance_id=instance_id, workflow_name=name
    )
    leased_at = time.monotonic()
    fence = store.create_instance(
        instance_id,
        name,
        json.loads(text),
        service_name=settings.service_name,
        lease_owner=None if worker is None else worker.worker_id,
        lease_ttl=None if worker is None else worker.settings.lease.ttl,
        code_version=settings.code_version,
        execution_timeout_ms=timeout_ms,
        trace_context=trace,
    )

    def started() -> None:
        hooks_module.fire(hooks, "on_workflow_started", instance_id=instance_id, workflow_name=name)
        signals.send("on_workflow_started", instance_id=instance_id, workflow_name=name)

    transaction.on_commit(started, using=store.alias)
    if worker is not None and fence is not None:
        snapshot = ExecutionSnapshot(instance_id, name, json.loads(text), WorkflowStatus.RUNNING)
        transaction.on_commit(
            lambda: worker.run_local_start(fence, snapshot, leased_at), using=store.alias
        )
    return instance_id


def signal(instance_id: str, channel: str, payload: Any = None) -> None:
    """Append ``payload`` to the instance's ``channel`` inbox and wake it.

    Accepted from creation until close, also while an execution holds the lease.
    Inside ``transaction.atomic()`` it commits with the caller. The channel must
    be 1 to 255 UTF-8 bytes (:class:`InvalidSignalChannel`) and the payload JSON
    (:class:`InvalidSignalPayload`); an instance that already holds
    ``MAX_PENDING_SIGNALS`` unconsumed signals refuses it (:class:`InboxFull`).
    Nothing is written otherwise.
    """
    if not valid_channel(channel):
        raise exc.InvalidSignalChannel(
            f"signal channel must contain 1 to 255 UTF-8 bytes and no NUL, not {channel!r}"[:300]
        )
    known_id(instance_id)
    store = client_store()
    try:
        text = store.codec.encode(payload, "signal payload")
    except exc.PayloadTooLarge:
        raise
    except exc.PayloadTooDeep as error:
        raise exc.InvalidSignalPayload(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.InvalidSignalPayload(f"signal payload is not JSON-encodable: {error}") from error
    settings = get_settings()
    trace = hooks_module.capture_trace_context(
        settings.hooks, "signal", instance_id=instance_id, workflow_name="", key=channel
    )
    store.append_signal(
        instance_id,
        channel,
        text,
        max_pending=settings.max_pending_signals,
        trace_context=trace,
    )


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
    client_store().request_cancel(instance_id, reason, trace_context=trace)


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
    name = store.terminate(instance_id, envelope, {"terminate": {"reason": reason}})
    hooks = get_settings().hooks

    def terminated() -> None:
        fields = dict(instance_id=instance_id, workflow_name=name, error=error, duration=0.0)
        hooks_module.fire(hooks, "on_workflow_failed", **fields)
        signals.send("on_workflow_failed", **fields)

    transaction.on_commit(terminated, using=store.alias)


astart_workflow = sync_to_async(start_workflow)
asignal = sync_to_async(signal)
acancel_workflow = sync_to_async(cancel_workflow)
aterminate_workflow = sync_to_async(terminate_workflow)
