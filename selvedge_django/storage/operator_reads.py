"""Reads of the operations layer: instances, their tasks and histories, pages and batches.

:class:`OperatorReads` holds the reads the operations layer
(:mod:`selvedge_django.operations`) makes of instances and what they own beyond
those of :mod:`.reads` (an instance row, a result): describe's task list,
``find_instances``' pages, an export's rows, the ids a bulk operation or a replay
check acts on, the running versions. Each method is one bounded statement (a
limit, one instance's rows, or one keyset page); the operations layer validates
its arguments and shapes the answer. The status report's reads are
:mod:`.status_reads`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Count, Q

from ..engine.attributes import AttributeCondition
from ..models import (
    PAUSED_OWNER,
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    WorkflowInstance,
    WorkflowStatus,
)
from .attributes import attribute_filter
from .operation import operation
from .resume import TERMINATED_TYPE

__all__ = ["OperatorReads"]


class OperatorReads:
    """The operations layer's bounded reads on the database ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -- one instance -----------------------------------------------------------------

    @operation
    def activity_tasks(self, instance_id: str) -> list[ActivityTask]:
        """An instance's activity task rows in issue order."""
        tasks = ActivityTask.objects.using(self.alias).filter(instance_id=instance_id)
        return list(tasks.order_by("seq", "id"))

    @operation
    def workflow_name(self, instance_id: str) -> str | None:
        """The workflow name of an instance, or None when there is no instance."""
        name: str | None = (
            WorkflowInstance.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .values_list("workflow_name", flat=True)
            .first()
        )
        return name

    @operation
    def history_events(self, instance_id: str, limit: int) -> list[tuple[Any, ...]]:
        """An instance's history rows in order, at most ``limit``: (seq, key, command,
        event_type, data, reservation, delivered_seq)."""
        return list(
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .values_list(
                "seq", "key", "command", "event_type", "data", "reservation", "delivered_seq"
            )[:limit]
        )

    @operation
    def signal_positions(self, instance_id: str, limit: int) -> list[tuple[Any, ...]]:
        """An instance's signals of its current generation in order, at most ``limit``:
        (id, channel, delivered_seq, consumed_seq)."""
        return list(
            SignalMessage.objects.using(self.alias)
            .filter(instance_id=instance_id, archived_generation__isnull=True)
            .order_by("id")
            .values_list("id", "channel", "delivered_seq", "consumed_seq")[:limit]
        )

    @operation
    def archived_events(self, instance_id: str, limit: int) -> list[tuple[Any, ...]]:
        """The rows an instance's resumes archived, oldest generation first, at most
        ``limit``: the columns of :meth:`history_events`, then generation, archived_at."""
        return list(
            ArchivedHistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id)
            .order_by("generation", "event_id")
            .values_list(
                "seq",
                "key",
                "command",
                "event_type",
                "data",
                "reservation",
                "delivered_seq",
                "generation",
                "archived_at",
            )[:limit]
        )

    # -- many instances ---------------------------------------------------------------

    @operation
    def find_instances(
        self,
        *,
        status: str | None,
        workflow_name: str | None,
        instance_id: str | None,
        started_after: datetime | None,
        started_before: datetime | None,
        input_filters: Sequence[tuple[list[str], Any]],
        attributes: Sequence[AttributeCondition] = (),
        before: tuple[datetime, str] | None,
        limit: int,
    ) -> list[WorkflowInstance]:
        """A page of instances, newest first, at most ``limit``.

        ``workflow_name`` and ``instance_id`` match partly, case-insensitively;
        ``input_filters`` are (path segments, JSON value) pairs the input must hold
        (see :mod:`selvedge_django.storage.sqlite.input_filters`); ``attributes`` are
        search attribute conditions (:func:`.attributes.attribute_filter`); ``before``
        is the (started_at, instance_id) of the last instance of the previous page.
        """
        qs = WorkflowInstance.objects.using(self.alias).all()
        if status is not None:
            qs = qs.filter(status=status)
        if workflow_name:
            qs = qs.filter(workflow_name__icontains=workflow_name)
        if instance_id:
            qs = qs.filter(instance_id__icontains=instance_id)
        if started_after is not None:
            qs = qs.filter(started_at__gt=started_after)
        if started_before is not None:
            qs = qs.filter(started_at__lt=started_before)
        if input_filters:
            # Imported here: the sqlite package imports the store, which holds these reads.
            from .sqlite.input_filters import input_value_equals

            qs = qs.filter(
                *(input_value_equals(qs.query, path, value) for path, value in input_filters)
            )
        if attributes:
            qs = qs.filter(attribute_filter(self.alias, attributes))
        if before is not None:
            started, last_id = before
            qs = qs.filter(
                Q(started_at__lt=started) | Q(started_at=started, instance_id__lt=last_id)
            )
        return list(qs.order_by("-started_at", "-instance_id")[:limit])

    @operation
    def selected_ids(
        self,
        *,
        status: str,
        workflow_name: str | None,
        exclude_terminated: bool,
        since: datetime | None,
        attributes: Sequence[AttributeCondition] = (),
        after: str,
        limit: int,
        paused: bool | None = None,
    ) -> list[str]:
        """The ids after ``after`` of the instances in ``status``, in order, at most ``limit``.

        ``workflow_name`` is an exact name; ``exclude_terminated`` leaves out failed
        runs closed by a terminate; ``since`` keeps the instances that closed (a
        running one: started) from then on; ``attributes`` are search attribute
        conditions, all of which must hold; ``paused`` keeps only the paused (True)
        or only the other (False) instances.
        """
        qs = WorkflowInstance.objects.using(self.alias).filter(status=status)
        if paused is not None:
            pause = Q(status=WorkflowStatus.RUNNING, lease_owner=PAUSED_OWNER)
            qs = qs.filter(pause) if paused else qs.exclude(pause)
        if workflow_name:
            qs = qs.filter(workflow_name=workflow_name)
        if exclude_terminated:
            qs = qs.exclude(error_type=TERMINATED_TYPE)
        if since is not None:
            field = "started_at" if status == WorkflowStatus.RUNNING else "closed_at"
            qs = qs.filter(**{f"{field}__gte": since})
        if attributes:
            qs = qs.filter(attribute_filter(self.alias, attributes))
        return list(
            qs.filter(instance_id__gt=after)
            .order_by("instance_id")
            .values_list("instance_id", flat=True)[:limit]
        )

    @operation
    def running_ids(self, workflow_names: Sequence[str], limit: int) -> list[str]:
        """The running instances of ``workflow_names``, the oldest started first, at most
        ``limit``."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(workflow_name__in=workflow_names)
            .filter(status=WorkflowStatus.RUNNING)
            .order_by("started_at")
            .values_list("instance_id", flat=True)[:limit]
        )

    @operation
    def closed_ids(self, workflow_names: Sequence[str], since: datetime, limit: int) -> list[str]:
        """The instances of ``workflow_names`` closed from ``since`` on, the latest closed
        first, at most ``limit``."""
        return list(
            WorkflowInstance.objects.using(self.alias)
            .filter(workflow_name__in=workflow_names)
            .exclude(status=WorkflowStatus.RUNNING)
            .filter(closed_at__gte=since)
            .order_by("-closed_at")
            .values_list("instance_id", flat=True)[:limit]
        )

    # -- running versions -------------------------------------------------------------

    @operation
    def running_version_counts(
        self, workflow_name: str | None, limit: int
    ) -> list[tuple[str, str | None, int]]:
        """(workflow, code version, running instances), in that order, at most ``limit``
        groups; on the partial index of running instances by workflow and version."""
        running = WorkflowInstance.objects.using(self.alias).filter(status=WorkflowStatus.RUNNING)
        if workflow_name is not None:
            running = running.filter(workflow_name=workflow_name)
        return list(
            running.values_list("workflow_name", "code_version")
            .annotate(n=Count("instance_id"))
            .order_by("workflow_name", "code_version")[:limit]
        )

    @operation
    def running_patch_counts(
        self, workflow_name: str | None, limit: int
    ) -> list[tuple[str, str | None, int]]:
        """(workflow, patch marker data, running instances holding it), in that order, at
        most ``limit`` groups; on the partial index of patch markers."""
        markers = HistoryEvent.objects.using(self.alias).filter(
            command="patch", instance__status=WorkflowStatus.RUNNING
        )
        if workflow_name is not None:
            markers = markers.filter(instance__workflow_name=workflow_name)
        return list(
            markers.values_list("instance__workflow_name", "data")
            .annotate(n=Count("instance_id", distinct=True))
            .order_by("instance__workflow_name", "data")[:limit]
        )
