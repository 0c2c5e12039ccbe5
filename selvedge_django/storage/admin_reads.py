"""The admin's reads: an instance's page, its timeline, the dashboard, filters, exports.

Each method is one bounded read (a capped number of rows, an aggregate, or a
count that stops at a limit), with long values cut in SQL where a caller asks
for a head, so a huge history or payload never reaches Python whole. Rows come
back as tuples or dicts of plain values; how they are shown is the admin's.
The changelist's own query set (filters, search, ordering, paging) is Django's
and stays in the admin.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    Q,
    QuerySet,
    Sum,
    TextField,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Length, Substr

from ..engine.attributes import AttributeCondition, AttributeValue
from ..models import (
    ActivityQueue,
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    Schedule,
    SignalMessage,
    TimerSubscription,
    WorkflowAttribute,
    WorkflowInstance,
    WorkflowStatus,
    WorkflowStream,
    WorkflowStreamEntry,
)
from .attributes import attribute_filter, value_of

__all__ = ["AdminReads"]

# The columns of an activity task the timeline draws from.
TIMELINE_TASK_FIELDS = (
    "key",
    "name",
    "status",
    "attempts",
    "failures",
    "max_attempts",
    "not_before_ms",
    "claim_started_ms",
    "last_error",
)


class AdminReads:
    """The admin's bounded reads on the database ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -- search attributes ----------------------------------------------------------------

    def attribute_condition(self, conditions: list[AttributeCondition]) -> Q:
        """The changelist's condition for search attribute filters (each on its index)."""
        return attribute_filter(self.alias, conditions)

    def attributes(self, instance_id: str) -> list[tuple[str, AttributeValue]]:
        """An instance's search attributes, by name (at most 64 per call set them, so a
        bounded number in practice; capped at 1,000 rows)."""
        rows = (
            WorkflowAttribute.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("name")
            .values_list("name", "kind", "text_value", "number_value", "time_value")[:1000]
        )
        return [
            (name, value_of(kind, text, number, when)) for name, kind, text, number, when in rows
        ]

    def common_attribute_names(self, *, sample: int, limit: int) -> list[str]:
        """The attribute names of the ``sample`` most recently started instances, at most
        ``limit``, in order: the filter box's suggestions (a bounded read)."""
        recent = (
            WorkflowInstance.objects.using(self.alias)
            .order_by("-started_at", "-instance_id")
            .values("instance_id")[:sample]
        )
        return list(
            WorkflowAttribute.objects.using(self.alias)
            .filter(instance_id__in=recent)
            .order_by("name")
            .values_list("name", flat=True)
            .distinct()[:limit]
        )

    # -- an instance's page ---------------------------------------------------------------

    def history_count(self, instance_id: str) -> int:
        """The number of history rows of an instance (the primary key's index)."""
        return HistoryEvent.objects.using(self.alias).filter(instance_id=instance_id).count()

    def history_rows(self, instance_id: str, *, cut: int, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` history rows, values cut to ``cut`` characters, with sizes:
        (seq, key, command, event_type, data head, reservation head, delivered_seq,
        data size, created_at, arrived_at)."""
        return list(
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .annotate(data_head=Substr("data", 1, cut), data_size=Length("data"))
            .annotate(reservation_head=Substr("reservation", 1, cut))
            .values_list(
                "seq",
                "key",
                "command",
                "event_type",
                "data_head",
                "reservation_head",
                "delivered_seq",
                "data_size",
                "created_at",
                "arrived_at",
            )[:limit]
        )

    def task_rows(self, instance_id: str, *, cut: int, limit: int) -> list[Any]:
        """The first ``limit`` activity tasks (rows of ``ActivityTask``) in command order,
        without their values but the last error, and their heartbeat details cut to
        ``cut`` characters (``details_head``) with their size (``details_size``)."""
        return list(
            ActivityTask.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("seq", "id")
            .annotate(
                details_head=Substr("heartbeat_details", 1, cut),
                details_size=Length("heartbeat_details"),
            )
            .only(
                "key",
                "name",
                "queue",
                "status",
                "attempts",
                "failures",
                "max_attempts",
                "last_error",
            )[:limit]
        )

    def timer_rows(self, instance_id: str, *, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` timers by expiry: (key, expires_at, fired)."""
        return list(
            TimerSubscription.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("expires_at", "id")
            .values_list("key", "expires_at", "fired")[:limit]
        )

    def signal_rows(self, instance_id: str, *, cut: int, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` signals of the inbox, payloads cut to ``cut`` characters:
        (id, channel, sent_at, delivered_seq, consumed_seq, consumed_key,
        idempotency_key, payload head, payload size)."""
        return list(
            SignalMessage.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .annotate(head=Substr("payload", 1, cut), size=Length("payload"))
            .values_list(
                "id",
                "channel",
                "sent_at",
                "delivered_seq",
                "consumed_seq",
                "consumed_key",
                "idempotency_key",
                "head",
                "size",
            )[:limit]
        )

    def stream_rows(self, instance_id: str, *, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` streams by key: (key, entries, closed)."""
        return list(
            WorkflowStream.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("key")
            .values_list("key", "last_seq", "closed")[:limit]
        )

    def stream_entry_rows(self, instance_id: str, *, cut: int, limit: int) -> list[tuple[Any, ...]]:
        """The ``limit`` stream entries written last, newest first, values cut to ``cut``
        characters: (key, seq, attempt, activity_id, written_at, value head, value size)."""
        return list(
            WorkflowStreamEntry.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("-written_at", "-id")
            .annotate(head=Substr("value", 1, cut), size=Length("value"))
            .values_list("key", "seq", "attempt", "activity_id", "written_at", "head", "size")[
                :limit
            ]
        )

    def child_rows(self, instance_id: str, *, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` children by start: (instance_id, workflow_name, status,
        parent_key)."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(parent_instance_id=instance_id)
            # Spelled as the partial index's condition, so SQLite can use that index.
            .exclude(parent_instance_id="")
            .order_by("started_at", "instance_id")
            .values_list("instance_id", "workflow_name", "status", "parent_key")[:limit]
        )

    def archived_rows(self, instance_id: str, *, cut: int, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` archived history rows (of earlier generations), values cut
        to ``cut`` characters: (generation, seq, key, event_type, data head, data size,
        archived_at)."""
        return list(
            ArchivedHistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("generation", "event_id")
            .annotate(data_head=Substr("data", 1, cut), data_size=Length("data"))
            .values_list(
                "generation", "seq", "key", "event_type", "data_head", "data_size", "archived_at"
            )[:limit]
        )

    def export_size(self, instance_ids: list[str]) -> int:
        """The characters of stored values an export of these instances would write."""

        def total(queryset: QuerySet[Any], *columns: Any) -> int:
            sizes = [Coalesce(Length(column), Value(0)) for column in columns]
            expression: Any = sizes[0]
            for size in sizes[1:]:
                expression = expression + size
            return int(queryset.aggregate(n=Sum(expression))["n"] or 0)

        instances = WorkflowInstance.objects.using(self.alias).filter(instance_id__in=instance_ids)
        history = HistoryEvent.objects.using(self.alias).filter(instance_id__in=instance_ids)
        return total(
            instances, Cast("input", TextField()), "output", "error", "cancel_reason"
        ) + total(history, "data", "reservation")

    # -- an instance's timeline -------------------------------------------------------------

    def timeline_rows(self, instance_id: str, *, limit: int) -> list[tuple[Any, ...]]:
        """The first ``limit`` history rows, timestamps only, no values: (key, command,
        event_type, created_at, arrived_at, whether a value is recorded)."""
        return list(
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .annotate(
                has_value=ExpressionWrapper(Q(data__isnull=False), output_field=BooleanField())
            )
            .values_list("key", "command", "event_type", "created_at", "arrived_at", "has_value")[
                :limit
            ]
        )

    def timeline_tasks(self, instance_id: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The activity tasks of these steps (at most one per key), by key."""
        return {
            task["key"]: task
            for task in ActivityTask.objects.using(self.alias)
            .filter(instance_id=instance_id, key__in=keys)
            .values(*TIMELINE_TASK_FIELDS)
        }

    # -- the dashboard ----------------------------------------------------------------------

    def count_status(self, status: str, *, limit: int) -> int:
        """The number of instances in ``status``, counting at most ``limit``."""
        instances = WorkflowInstance.objects.using(self.alias).filter(status=status)
        return int(instances.order_by()[:limit].count())

    def recent_workflow_counts(self, *, sample: int) -> list[tuple[str, str, int]]:
        """(workflow_name, status, count) among the ``sample`` most recently started
        instances."""
        instances = WorkflowInstance.objects.using(self.alias)
        recent = instances.order_by("-started_at", "-instance_id").values("instance_id")[:sample]
        return [
            (name, status, int(n))
            for name, status, n in (
                instances.filter(instance_id__in=recent)
                .values_list("workflow_name", "status")
                .annotate(n=Count("instance_id"))
                .order_by()
            )
        ]

    def failures_since(self, since: datetime, *, limit: int) -> list[tuple[Any, ...]]:
        """Failed runs closed since ``since``, newest first, at most ``limit``:
        (instance_id, workflow_name, error_type, closed_at)."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(status=WorkflowStatus.FAILED, closed_at__gte=since)
            .order_by("-closed_at")
            .values_list("instance_id", "workflow_name", "error_type", "closed_at")[:limit]
        )

    def recent_step_times(self, *, window: int) -> list[tuple[Any, ...]]:
        """Activity and child steps that arrived among the last ``window`` history rows
        (a range of the primary key): (instance_id, key, created_at, arrived_at)."""
        history = HistoryEvent.objects.using(self.alias)
        last = history.order_by("-id").values_list("id", flat=True).first()
        if last is None:
            return []
        return list(
            history.filter(id__gt=last - window, command__in=("activity", "child"))
            .exclude(arrived_at=None)
            .values_list("instance_id", "key", "created_at", "arrived_at")
        )

    # -- the changelist's filters -------------------------------------------------------------

    def running_code_versions(self, *, limit: int) -> list[str | None]:
        """The distinct code versions of running instances (a partial index holds them),
        at most ``limit``."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(status="running")
            .order_by("code_version")
            .values_list("code_version", flat=True)
            .distinct()[:limit]
        )

    def recent_error_types(self, *, sample: int) -> list[str | None]:
        """The error types of the ``sample`` most recently started failed runs (through
        the (status, started_at) index: never the whole table)."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(status="failed")
            .order_by("-started_at")
            .values_list("error_type", flat=True)[:sample]
        )

    # -- schedules ----------------------------------------------------------------------------

    def instance_statuses(self, instance_ids: list[str]) -> dict[str, str]:
        """The status of each of these instances that still exists, by id."""
        return dict(
            WorkflowInstance.objects.using(self.alias)
            .filter(instance_id__in=instance_ids)
            .values_list("instance_id", "status")
        )

    def schedule_exists(self, name: str) -> bool:
        """Whether a schedule called ``name`` exists."""
        return bool(Schedule.objects.using(self.alias).filter(name=name).exists())

    def activity_queue(self, name: str) -> ActivityQueue | None:
        """The row of an activity queue an operator paused once (the admin log's object)."""
        return ActivityQueue.objects.using(self.alias).filter(name=name).first()
