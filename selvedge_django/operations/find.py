"""Reads of instances: describe one, list its activity tasks, find instances by filters.

Every read is bounded: one row, one instance's tasks, or one page of at most
1,000 instances with a cursor (``next_page_token``) for the next.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, Unpack

from asgiref.sync import sync_to_async

from .. import exceptions as exc
from ..engine.attributes import AttributeValue, parse_filters
from ..engine.codec import contains_nul, error_from_envelope, error_to_envelope
from ..engine.options import ActivityOptions
from ..handles import WorkflowDescription
from ..models import PAUSED_OWNER, WorkflowInstance, WorkflowStatus
from .base import client_store, filter_text, known_id, read_store, validate_instance_id

__all__ = [
    "ActivityTaskInfo",
    "InstanceFilters",
    "InstancePage",
    "WorkflowDescription",
    "adescribe",
    "afind_instances",
    "alist_activity_tasks",
    "describe",
    "find_instances",
    "iter_instances",
    "list_activity_tasks",
]

_PATH_RE = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
# An input filter path has at most this many segments and characters (each segment is
# one nested JSON lookup in the query, compiled recursively).
MAX_FILTER_PATH_SEGMENTS = 32
MAX_FILTER_PATH_CHARS = 255


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
    # The last heartbeat details a claim renewal stored (None: none), which the next
    # attempt receives as activity_info().heartbeat_details.
    heartbeat_details: Any = None

    def to_json(self) -> dict[str, Any]:
        """Return the task as JSON-safe data (the last error as its envelope)."""
        return {
            "key": self.key,
            "name": self.name,
            "queue": self.queue,
            "status": self.status,
            "seq": self.seq,
            "options": self.options.to_json(),
            "attempts": self.attempts,
            "failures": self.failures,
            "last_error": None
            if self.last_error is None
            else error_to_envelope(self.last_error, with_traceback=False),
            "heartbeat_details": self.heartbeat_details,
        }


def _describe(
    inst: WorkflowInstance, attributes: dict[str, AttributeValue] | None = None
) -> WorkflowDescription:
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
        generation=inst.generation,
        resumed_count=inst.resumed_count,
        forked_from=inst.forked_from or None,
        code_version=inst.code_version,
        execution_timeout=(
            None
            if inst.execution_timeout_ms is None
            else timedelta(milliseconds=inst.execution_timeout_ms)
        ),
        execution_deadline=_from_ms(inst.execution_deadline_ms),
        progress=client_store().codec.decode(inst.progress),
        priority=inst.priority,
        attributes=dict(attributes or {}),
        **_pause_fields(inst),
    )


def _pause_fields(inst: WorkflowInstance) -> dict[str, Any]:
    """paused, paused_reason and paused_at of a description (a closed run: not paused)."""
    paused = inst.status == WorkflowStatus.RUNNING and inst.lease_owner == PAUSED_OWNER
    return {
        "paused": paused,
        "paused_reason": inst.paused_reason if paused else "",
        "paused_at": inst.paused_at if paused else None,
    }


def _from_ms(ms: int | None) -> datetime | None:
    """A database-clock time in Unix milliseconds as an aware UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def describe(instance_id: str) -> WorkflowDescription:
    """Return the durable status, cancellation, parent links and attributes of an instance."""
    store = client_store()
    instance = store.get_instance(known_id(instance_id))
    return _describe(instance, store.attributes.of(instance.instance_id))


def list_activity_tasks(instance_id: str) -> list[ActivityTaskInfo]:
    """Return an instance's activity tasks in issue order."""
    store = client_store()
    store.get_instance(known_id(instance_id))
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
            last_error=(
                error_from_envelope(json.loads(t.last_error), store.codec) if t.last_error else None
            ),
            heartbeat_details=store.codec.decode(t.heartbeat_details),
        )
        for t in store.operator_reads.activity_tasks(instance_id)
    ]


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


class InstanceFilters(TypedDict, total=False):
    """The filters of :func:`find_instances`, as :func:`iter_instances` takes them."""

    status: str | None
    workflow_name: str | None
    instance_id: str | None
    started_after: datetime | None
    started_before: datetime | None
    input_filters: dict[str, Any] | None
    attributes: dict[str, Any] | None


def find_instances(
    *,
    status: str | None = None,
    workflow_name: str | None = None,
    instance_id: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    input_filters: dict[str, Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
    limit: int = 50,
    page_token: str | None = None,
) -> InstancePage:
    """List instances, newest first, with filters and cursor pagination.

    ``workflow_name`` and ``instance_id`` are partial, case-insensitive matches.
    ``input_filters`` maps dotted JSON paths (letters, digits, ``_`` and ``.``)
    to exact values; a malformed path raises ``ValueError``. Values are always
    bound as query parameters.

    ``attributes`` filters by search attributes: ``{"tenant": "acme", "amount__gte":
    100, "region__in": ["eu", "us"]}``, with the lookups ``exact`` (the default),
    ``gt``, ``gte``, ``lt``, ``lte`` and ``in``, all combined with the other filters
    by AND; each is answered from an index. Numbers compare by value (``5`` matches
    ``5.0``), never with strings or bools; strings compare in the database's
    order. A bad name, value or lookup raises ``ValueError``.

    It reads ``SELVEDGE["READ_DATABASE"]`` when one is set (a replica, which may lag;
    :func:`~selvedge_django.operations.base.read_store`).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError("limit must be an integer from 1 to 1000")
    store = read_store()
    if status is not None and status not in WorkflowStatus.values:
        raise ValueError(f"unknown status {status!r}")
    if workflow_name:
        workflow_name = filter_text(workflow_name, "workflow_name")
    if instance_id:
        instance_id = filter_text(instance_id, "instance_id")
    conditions: list[tuple[list[str], Any]] = []
    if input_filters:
        if store.codec.payload is not None:
            raise ValueError(
                "find_instances(input_filters=...) cannot match workflow inputs encrypted by"
                " SELVEDGE['PAYLOAD_CODEC']; give the instances attributes to find them by"
            )
        if not isinstance(input_filters, dict):
            raise ValueError("input_filters must be a dict of dotted paths to values")
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
                encoded = store.codec.encode_plain(value, "input filter value")
            except (TypeError, ValueError) as error:
                raise ValueError(f"input filter value for {path!r} is not JSON") from error
            if contains_nul(encoded):
                raise ValueError(f"input filter value for {path!r} contains a NUL character")
            conditions.append((path.split("."), json.loads(encoded)))
    attribute_conditions = parse_filters(attributes)
    rows = store.operator_reads.find_instances(
        status=status,
        workflow_name=workflow_name,
        instance_id=instance_id,
        started_after=started_after,
        started_before=started_before,
        input_filters=conditions,
        attributes=attribute_conditions,
        before=_decode_token(page_token) if page_token else None,
        limit=limit + 1,
    )
    has_more = len(rows) > limit
    rows = rows[:limit]
    token = _encode_token(rows[-1].started_at, rows[-1].instance_id) if has_more else None
    found = store.attributes.of_many([r.instance_id for r in rows])
    return InstancePage([_describe(r, found.get(r.instance_id)) for r in rows], token, has_more)


def iter_instances(
    *, limit: int, **filters: Unpack[InstanceFilters]
) -> Iterator[WorkflowDescription]:
    """Yield up to ``limit`` instances, newest first, one page of :func:`find_instances` at a time.

    ``filters`` are those of :func:`find_instances`; each page holds at most 1,000.
    """
    token: str | None = None
    while limit > 0:
        page = find_instances(**filters, limit=min(limit, 1000), page_token=token)
        yield from page.instances
        limit -= len(page.instances)
        token = page.next_page_token
        if not page.has_more or token is None:
            return


adescribe = sync_to_async(describe)
afind_instances = sync_to_async(find_instances)
alist_activity_tasks = sync_to_async(list_activity_tasks)
