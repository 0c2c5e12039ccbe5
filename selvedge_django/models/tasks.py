"""Activity tasks: the durable input, policy and current claim of each activity.

A task belongs to the instance that scheduled it (its history row holds the
outcome); activity workers claim tasks by rank (see docs/flow-control.md), and
rate-limited queues count their claims in
:class:`~selvedge_django.models.system.QueueClaim`.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from .instances import WorkflowInstance
from .system import PriorityRank

__all__ = ["ActivityTask", "ActivityTaskQuerySet", "ActivityTaskStatus"]


class ActivityTaskStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class ActivityTaskQuerySet(models.QuerySet["ActivityTask"]):
    def claimable(self, now_ms: Any) -> ActivityTaskQuerySet:
        """What an activity worker may claim: queued and due, or running with a claim that
        lapsed before ``now_ms`` and retries left (a lapse counts as a failure; the
        leader's sweep fails a task whose lapse exhausts its attempts); never a held
        task (of a paused instance)."""
        return self.filter(held=False).filter(
            Q(status=ActivityTaskStatus.QUEUED, not_before_ms__lte=now_ms)
            | (
                Q(status=ActivityTaskStatus.RUNNING, claim_expires_ms__lt=now_ms)
                & (Q(max_attempts=0) | Q(failures__lt=F("max_attempts") - 1))
            )
        )

    def unfinished(self) -> ActivityTaskQuerySet:
        return self.filter(status__in=(ActivityTaskStatus.QUEUED, ActivityTaskStatus.RUNNING))


class ActivityTask(models.Model):
    """The durable input, policy and current claim of one activity."""

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="activity_tasks",
        db_index=False,  # the unique (instance, key) index leads with it
    )
    workflow_name = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    seq = models.BigIntegerField()
    name = models.CharField(max_length=255)
    input = models.TextField()
    queue = models.CharField(max_length=255, default="", blank=True)
    options = models.JSONField(default=dict)
    max_attempts = models.IntegerField(default=5)
    priority = models.SmallIntegerField(
        default=0, db_default=0, help_text="claim order, -100 to 100, larger first"
    )
    concurrency_key = models.CharField(max_length=255, default="", db_default="", blank=True)
    max_concurrency = models.IntegerField(null=True, blank=True)  # of concurrency_key, if any
    status = models.CharField(
        max_length=16, choices=ActivityTaskStatus.choices, default=ActivityTaskStatus.QUEUED
    )
    attempts = models.IntegerField(default=0, help_text="claims so far")
    failures = models.IntegerField(default=0, help_text="attempts that used retry budget")
    not_before_ms = models.BigIntegerField(default=0)  # due (and ready) from, database clock
    last_error = models.TextField(null=True, blank=True)
    claim_owner = models.CharField(max_length=255, default="", blank=True)
    claim_epoch = models.BigIntegerField(default=0)
    claim_expires_ms = models.BigIntegerField(null=True, blank=True)
    claim_started_ms = models.BigIntegerField(null=True, blank=True)
    schedule_to_start_ms = models.BigIntegerField(null=True, blank=True)
    start_to_close_ms = models.BigIntegerField(null=True, blank=True)
    heartbeat_timeout_ms = models.BigIntegerField(null=True, blank=True)
    schedule_deadline_ms = models.BigIntegerField(null=True, blank=True)
    attempt_deadline_ms = models.BigIntegerField(null=True, blank=True)
    heartbeat_details = models.TextField(
        null=True,
        blank=True,
        help_text="JSON text of the last heartbeat details a claim renewal stored (NULL: none)",
    )
    held = models.BooleanField(
        default=False,
        db_default=False,
        help_text="its instance is paused: no claim takes it until the unpause",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ActivityTaskQuerySet.as_manager()

    class Meta:
        verbose_name = _("activity task")
        ordering = ("instance", "seq")
        constraints = [
            models.UniqueConstraint(fields=["instance", "key"], name="sv_task_key_uniq"),
        ]
        indexes = [
            # The queued tasks by due time (sv_task_queued_idx: the next one due) and by rank
            # (sv_task_rank_idx: the order claims walk, sql.TASK_RANK; a held task, of a
            # paused instance, is not in it), and the running attempts of each concurrency
            # key, which claims count.
            models.Index(
                fields=["not_before_ms", "id"],
                name="sv_task_queued_idx",
                condition=Q(status="queued"),
            ),
            models.Index(
                PriorityRank("not_before_ms", "priority"),
                "id",
                "not_before_ms",
                name="sv_task_rank_idx",
                condition=Q(status="queued", held=False),
            ),
            models.Index(
                fields=["concurrency_key"],
                name="sv_task_running_key_idx",
                condition=Q(status="running") & ~Q(concurrency_key=""),
            ),
            models.Index(
                fields=["claim_expires_ms"],
                name="sv_task_claim_idx",
                condition=Q(status="running"),
            ),
            models.Index(
                fields=["schedule_deadline_ms"],
                name="sv_task_schedule_idx",
                condition=Q(status="queued", schedule_deadline_ms__isnull=False),
            ),
            # Queue depths of the status report: each queue's queued tasks, oldest first.
            models.Index(
                fields=["queue", "not_before_ms"],
                name="sv_task_queue_idx",
                condition=Q(status="queued"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key} ({self.name})"
