"""The operations layer: starting, reading, waiting for and listing workflows.

The public client API, the admin actions and ``manage.py runselvedge`` all call
these functions; none of them sets a status by hand. Writes validate their input
before anything is written, join the caller's ``transaction.atomic()`` when
there is one, and wake workers only after commit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from . import exceptions as exc
from . import hooks as hooks_module
from . import signals
from .conf import get_settings
from .engine.codec import Codec, contains_nul, error_from_envelope
from .engine.events import error_data
from .engine.identifiers import (
    check_instance_id,
    check_workflow_name,
    instance_id_problem,
    valid_channel,
)
from .engine.options import ActivityOptions
from .engine.ports import ExecutionSnapshot
from .input_filters import input_value_equals
from .local_starts import local_worker, running_here
from .models import ActivityTask, WorkflowInstance, WorkflowStatus
from .notify import Waker
from .registry import WorkflowDefinition, get_workflow
from .runtime import check_vendor, client_codec
from .schedules import (
    ScheduleDescription,
    abackfill_schedule,
    acreate_schedule,
    adelete_schedule,
    adescribe_schedule,
    alist_schedules,
    apause_schedule,
    atrigger_schedule,
    aunpause_schedule,
    aupdate_schedule,
    backfill_schedule,
    create_schedule,
    delete_schedule,
    describe_schedule,
    list_schedules,
    pause_schedule,
    trigger_schedule,
    unpause_schedule,
    update_schedule,
)
from .store import DjangoStore

if TYPE_CHECKING:
    from .history import RecordedHistory

__all__ = [
    "ActivityTaskInfo",
    "InstancePage",
    "ScheduleDescription",
    "WorkflowDescription",
    "WorkflowResult",
    "abackfill_schedule",
    "acancel_workflow",
    "acreate_schedule",
    "adelete_schedule",
    "adescribe",
    "adescribe_schedule",
    "aexport_history",
    "afind_instances",
    "aget_workflow_result",
    "alist_activity_tasks",
    "alist_schedules",
    "apause_schedule",
    "aquery",
    "asignal",
    "astart_workflow",
    "aterminate_workflow",
    "atrigger_schedule",
    "aunpause_schedule",
    "aupdate_schedule",
    "await_workflow",
    "backfill_schedule",
    "cancel_workflow",
    "create_schedule",
    "delete_schedule",
    "describe",
    "describe_schedule",
    "find_instances",
    "get_workflow_result",
    "list_activity_tasks",
    "list_schedules",
    "pause_schedule",
    "prune",
    "signal",
    "start_workflow",
    "terminate_workflow",
    "trigger_schedule",
    "unpause_schedule",
    "update_schedule",
    "wait_workflow",
]

In = TypeVar("In")

_PATH_RE = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
# An input filter path has at most this many segments and characters (each segment is
# one nested JSON lookup in the query, compiled recursively).
MAX_FILTER_PATH_SEGMENTS = 32
MAX_FILTER_PATH_CHARS = 255

# The most instances one prune batch deletes (their ids are one IN list).
MAX_PRUNE_BATCH = 5000

_client: tuple[Any, DjangoStore] | None = None
_stores_lock = threading.Lock()


def _store() -> DjangoStore:
    """The client API's store, rebuilt whenever the settings object changes."""
    global _client
    settings = get_settings()
    with _stores_lock:
        if _client is None or _client[0] is not settings:
            check_vendor(settings.database)
            store = DjangoStore(settings.database, client_codec(settings))
            if settings.listen_notify is not None:
                store.notify_enabled = settings.listen_notify and store.vendor == "postgresql"
            store.listen_alias = settings.listen_database or settings.database
            _client = (settings, store)
        return _client[1]


def _codec() -> Codec:
    return _store().codec


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowResult:
    """The current result of an instance: ``output`` when completed, ``error`` otherwise."""

    instance_id: str
    status: str
    output: Any = None
    error: BaseException | None = None


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
        }


@dataclass(frozen=True)
class InstancePage:
    """One page of :func:`find_instances`; pass ``next_page_token`` for the next."""

    instances: list[WorkflowDescription]
    next_page_token: str | None
    has_more: bool


@dataclass(frozen=True)
class ActivityTaskInfo:
    """The recorded policy and execution state of one activity task."""

    key: str
    name: str
    queue: str
    status: str
    seq: int
    options: ActivityOptions  # as recorded at reservation (no non-retryable error classes)
    attempts: int
    failures: int
    last_error: BaseException | None


def _describe(inst: WorkflowInstance) -> WorkflowDescription:
    return WorkflowDescription(
        instance_id=inst.instance_id,
        workflow_name=inst.workflow_name,
        status=inst.status,
        cancel_requested=inst.cancel_requested,
        cancel_reason=inst.cancel_reason,
        parent_instance_id=inst.parent_instance_id,
        parent_key=inst.parent_key,
        started_at=inst.started_at,
        updated_at=inst.updated_at,
        execution_errors=inst.execution_errors,
        execution_error=inst.execution_error,
    )


def _result(
    instance_id: str, status: str, output_text: str | None, error_text: str | None
) -> WorkflowResult:
    output = None
    error: BaseException | None = None
    if status == WorkflowStatus.COMPLETED and output_text is not None:
        output = json.loads(output_text)
    elif error_text:
        error = error_from_envelope(json.loads(error_text))
    return WorkflowResult(instance_id, status, output, error)


# -- validation -------------------------------------------------------------------------


def validate_instance_id(instance_id: object) -> str:
    """Return a valid instance id or raise WorkflowStartRejected (see engine.identifiers)."""
    return check_instance_id(instance_id)


def known_id(instance_id: object) -> str:
    """Return ``instance_id`` for a lookup; raise WorkflowNotFound if no instance can have it.

    An id that breaks the instance-id rule was refused at every start, so the
    answer is known without a query (and PostgreSQL is never sent a NUL).
    """
    if instance_id_problem(instance_id) is not None:
        raise exc.WorkflowNotFound(repr(instance_id)[:300])
    return str(instance_id)


# -- writes -----------------------------------------------------------------------------


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[In, Any],
    input: In,
    *,
    instance_id: str | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: WorkflowDefinition[None, Any],
    input: None = None,
    *,
    instance_id: str | None = None,
) -> str: ...


@overload
def start_workflow(
    workflow_or_name: str,
    input: Any = None,
    *,
    instance_id: str | None = None,
) -> str: ...


def start_workflow(
    workflow_or_name: WorkflowDefinition[Any, Any] | str,
    input: Any = None,
    *,
    instance_id: str | None = None,
) -> str:
    """Create a workflow instance and return its id.

    Starting by name needs no local registration. Inside ``transaction.atomic()``
    the start commits or rolls back with the caller's transaction, and workers are
    woken only after commit. A taken id raises :class:`WorkflowAlreadyStarted`; an
    invalid id or unencodable input raises :class:`WorkflowStartRejected` with
    nothing written.
    """
    name = check_workflow_name(
        workflow_or_name.name
        if isinstance(workflow_or_name, WorkflowDefinition)
        else workflow_or_name
    )
    instance_id = uuid.uuid4().hex if instance_id is None else validate_instance_id(instance_id)
    store = _store()
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
    leased_at = time.monotonic()
    fence = store.create_instance(
        instance_id,
        name,
        json.loads(text),
        service_name=settings.service_name,
        lease_owner=None if worker is None else worker.worker_id,
        lease_ttl=None if worker is None else worker.settings.lease.ttl,
    )
    hooks = settings.hooks

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
    store = _store()
    try:
        text = store.codec.encode(payload, "signal payload")
    except exc.PayloadTooLarge:
        raise
    except exc.PayloadTooDeep as error:
        raise exc.InvalidSignalPayload(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.InvalidSignalPayload(f"signal payload is not JSON-encodable: {error}") from error
    store.append_signal(instance_id, channel, text, max_pending=get_settings().max_pending_signals)


def cancel_workflow(instance_id: str, reason: str = "") -> None:
    """Durably request cancellation of an instance and wake it.

    Completed or failed instances raise an :class:`InstanceClosed` subclass; an
    already cancelled instance is fine. The workflow observes the request at its
    next blocking wait.
    """
    _store().request_cancel(known_id(instance_id), _reason(reason))


def _reason(reason: object) -> str:
    """An operator's reason as the database stores it: text without NUL, at most 10,000
    characters."""
    if not isinstance(reason, str):
        raise TypeError("reason must be a string")
    return _filter_text(reason, "reason")[:10_000]


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
    reason = _reason(reason)
    instance_id = known_id(instance_id)
    store = _store()
    error = exc.WorkflowTerminated(instance_id, reason)
    envelope = error_data(error, codec=store.codec)
    name = store.terminate(instance_id, envelope, {"terminate": {"reason": reason}})
    hooks = get_settings().hooks

    def terminated() -> None:
        fields = dict(instance_id=instance_id, workflow_name=name, error=error, duration=0.0)
        hooks_module.fire(hooks, "on_workflow_failed", **fields)
        signals.send("on_workflow_failed", **fields)

    transaction.on_commit(terminated, using=store.alias)


def prune(
    older_than: timedelta,
    *,
    statuses: list[str] | None = None,
    workflow_name: str | None = None,
    batch_size: int = 500,
    progress: Any = None,
) -> int:
    """Delete closed instances older than ``older_than`` with everything they own.

    Works in bounded batches (one transaction each). Never deletes a running
    instance, nor a child whose parent is still running. ``progress`` is called
    with the running total after each batch. Returns how many were deleted.
    """
    closed = {WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED}
    wanted = set(statuses) if statuses else closed
    if not wanted <= closed:
        raise ValueError(f"prune only deletes closed instances, not {sorted(wanted - closed)}")
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValueError("older_than must be a non-negative timedelta")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError("batch_size must be an int")
    if not 1 <= batch_size <= MAX_PRUNE_BATCH:
        # One batch is one IN list of ids in the delete.
        raise ValueError(f"batch_size must be from 1 to {MAX_PRUNE_BATCH}")
    store = _store()
    cutoff = timezone.now() - older_than
    running = WorkflowInstance.objects.using(store.alias).filter(status=WorkflowStatus.RUNNING)
    total = 0
    while True:
        qs = (
            WorkflowInstance.objects.using(store.alias)
            .filter(status__in=sorted(wanted), closed_at__lt=cutoff)
            .exclude(parent_instance_id__in=running.values("instance_id"))
        )
        if workflow_name:
            qs = qs.filter(workflow_name=workflow_name)
        with store.atomic():
            ids = list(qs.order_by("closed_at").values_list("instance_id", flat=True)[:batch_size])
            if not ids:
                break
            WorkflowInstance.objects.using(store.alias).filter(instance_id__in=ids).delete()
        total += len(ids)
        if progress is not None:
            progress(total)
        if len(ids) < batch_size:
            break
    return total


# -- reads ------------------------------------------------------------------------------


def get_workflow_result(instance_id: str) -> WorkflowResult:
    """Read an instance's current status and result without waiting."""
    return _result(instance_id, *_store().get_result_row(known_id(instance_id)))


def wait_workflow(instance_id: str, timeout: float | None = None) -> WorkflowResult:
    """Wait until the instance is closed and return its result.

    Raises ``TimeoutError`` when ``timeout`` seconds pass first. Wake-ups from
    workers in this process cut the wait short; ``WAIT_POLL_INTERVAL`` is the
    fallback polling interval.
    """
    known_id(instance_id)
    store = _store()
    poll = get_settings().wait_poll_interval
    deadline = None if timeout is None else time.monotonic() + timeout
    waker = Waker()
    topic = f"closed:{instance_id}"
    store.bus.subscribe(topic, waker)
    if store.notify_enabled:
        from .worker.notify import ensure_listener

        ensure_listener(store.listen_alias, store.bus)
    # An execution handed to a worker of this process is running: no need to read
    # the row first (its close wakes this waiter; subscribed above, so none is missed).
    read = not running_here(instance_id)
    try:
        while True:
            if read:
                result = get_workflow_result(instance_id)
                if result.status != WorkflowStatus.RUNNING:
                    return result
            read = True
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"workflow {instance_id!r} still running after {timeout} seconds"
                    )
                wait = min(wait, remaining)
            waker.wait(wait)
    finally:
        store.bus.unsubscribe(topic, waker)


def describe(instance_id: str) -> WorkflowDescription:
    """Return the durable status, cancellation and parent links of an instance."""
    return _describe(_store().get_instance(known_id(instance_id)))


def list_activity_tasks(instance_id: str) -> list[ActivityTaskInfo]:
    """Return an instance's activity tasks in issue order."""
    store = _store()
    store.get_instance(known_id(instance_id))
    tasks = ActivityTask.objects.using(store.alias).filter(instance_id=instance_id)
    return [
        ActivityTaskInfo(
            key=t.key,
            name=t.name,
            queue=t.queue,
            status=t.status,
            seq=t.seq,
            options=ActivityOptions.from_json(t.options or {}),
            attempts=t.attempts,
            failures=t.failures,
            last_error=error_from_envelope(json.loads(t.last_error)) if t.last_error else None,
        )
        for t in tasks.order_by("seq", "id")
    ]


def _filter_text(value: object, what: str) -> str:
    """A text filter the database can take: a string of UTF-8 without NUL."""
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError(f"{what} must be a string without NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid UTF-8 (no lone surrogates)") from None
    return value


def _encode_token(started_at: datetime, instance_id: str) -> str:
    raw = json.dumps([started_at.isoformat(), instance_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_token(token: str) -> tuple[datetime, str]:
    try:
        started, instance_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        when = datetime.fromisoformat(started)
        if when.tzinfo is None or not isinstance(instance_id, str):
            raise ValueError("not a token find_instances issued")
        return when, validate_instance_id(instance_id)
    except (ValueError, TypeError, AttributeError, exc.WorkflowStartRejected) as error:
        raise ValueError(f"invalid page_token {token!r}"[:300]) from error


def find_instances(
    *,
    status: str | None = None,
    workflow_name: str | None = None,
    instance_id: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    input_filters: dict[str, Any] | None = None,
    limit: int = 50,
    page_token: str | None = None,
) -> InstancePage:
    """List instances, newest first, with filters and cursor pagination.

    ``workflow_name`` and ``instance_id`` are partial, case-insensitive matches.
    ``input_filters`` maps dotted JSON paths (letters, digits, ``_`` and ``.``)
    to exact values; a malformed path raises ``ValueError``. Values are always
    bound as query parameters.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError("limit must be an integer from 1 to 1000")
    store = _store()
    qs = WorkflowInstance.objects.using(store.alias).all()
    if status is not None:
        if status not in WorkflowStatus.values:
            raise ValueError(f"unknown status {status!r}")
        qs = qs.filter(status=status)
    if workflow_name:
        qs = qs.filter(workflow_name__icontains=_filter_text(workflow_name, "workflow_name"))
    if instance_id:
        qs = qs.filter(instance_id__icontains=_filter_text(instance_id, "instance_id"))
    if started_after is not None:
        qs = qs.filter(started_at__gt=started_after)
    if started_before is not None:
        qs = qs.filter(started_at__lt=started_before)
    if input_filters:
        if not isinstance(input_filters, dict):
            raise ValueError("input_filters must be a dict of dotted paths to values")
        conditions: list[Any] = []
        for path, value in input_filters.items():
            if (
                not isinstance(path, str)
                or len(path) > MAX_FILTER_PATH_CHARS
                or path.count(".") >= MAX_FILTER_PATH_SEGMENTS
                or not _PATH_RE.fullmatch(path)
            ):
                raise ValueError(
                    f"invalid input filter path {path!r}: use letters, digits, _ and ., "
                    f"at most {MAX_FILTER_PATH_SEGMENTS} segments and "
                    f"{MAX_FILTER_PATH_CHARS} characters"[:400]
                )
            try:
                encoded = store.codec.encode(value, "input filter value")
            except (TypeError, ValueError) as error:
                raise ValueError(f"input filter value for {path!r} is not JSON") from error
            if contains_nul(encoded):
                raise ValueError(f"input filter value for {path!r} contains a NUL character")
            conditions.append(input_value_equals(qs.query, path.split("."), json.loads(encoded)))
        qs = qs.filter(*conditions)
    if page_token:
        started, last_id = _decode_token(page_token)
        qs = qs.filter(Q(started_at__lt=started) | Q(started_at=started, instance_id__lt=last_id))
    rows = list(qs.order_by("-started_at", "-instance_id")[: limit + 1])
    has_more = len(rows) > limit
    rows = rows[:limit]
    token = _encode_token(rows[-1].started_at, rows[-1].instance_id) if has_more else None
    return InstancePage([_describe(r) for r in rows], token, has_more)


# -- async twins ------------------------------------------------------------------------

astart_workflow = sync_to_async(start_workflow)
asignal = sync_to_async(signal)
acancel_workflow = sync_to_async(cancel_workflow)
aterminate_workflow = sync_to_async(terminate_workflow)
aget_workflow_result = sync_to_async(get_workflow_result)
adescribe = sync_to_async(describe)
afind_instances = sync_to_async(find_instances)
alist_activity_tasks = sync_to_async(list_activity_tasks)


def _query(instance_id: str, name: str, *, timeout: float | timedelta | None = None) -> Any:
    from .history import query

    return query(instance_id, name, timeout=timeout)


def _export(instance_id: str, *, redact: bool = False) -> RecordedHistory:
    from .history import export_history

    return export_history(instance_id, redact=redact)


aquery = sync_to_async(_query)
aexport_history = sync_to_async(_export)


class _LoopWaker(Waker):
    """A bus waker that wakes a coroutine: sets an asyncio.Event from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.event = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self.event.set)


def _subscribe_closed(instance_id: str, waker: Waker) -> tuple[DjangoStore, bool]:
    """Subscribe ``waker`` to the instance's close; return the store and whether to read."""
    store = _store()
    store.bus.subscribe(f"closed:{instance_id}", waker)
    if store.notify_enabled:
        from .worker.notify import ensure_listener

        ensure_listener(store.listen_alias, store.bus)
    return store, not running_here(instance_id)


async def await_workflow(instance_id: str, timeout: float | None = None) -> WorkflowResult:
    """Async twin of :func:`wait_workflow`, woken the same way, without blocking the loop.

    The close of the instance wakes it (from workers in this process, and through
    ``LISTEN`` on PostgreSQL); ``WAIT_POLL_INTERVAL`` is the fallback poll.
    """
    poll = get_settings().wait_poll_interval
    deadline = None if timeout is None else time.monotonic() + timeout
    waker = _LoopWaker(asyncio.get_running_loop())
    # Subscribed before the first read, so a close in between is not missed.
    store, read = await sync_to_async(_subscribe_closed)(instance_id, waker)
    try:
        while True:
            if read:
                result = await aget_workflow_result(instance_id)
                if result.status != WorkflowStatus.RUNNING:
                    return result
            read = True
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"workflow {instance_id!r} still running after {timeout} seconds"
                    )
                wait = min(wait, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker.event.wait(), wait)
            waker.event.clear()
    finally:
        store.bus.unsubscribe(f"closed:{instance_id}", waker)


def _now() -> datetime:
    return timezone.now()
