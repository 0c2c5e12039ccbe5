"""Schedules: a definition the operations layer writes, and the leader's bookkeeping.

The rules of slots are in :mod:`selvedge_django.schedules.slots`, the definitions'
validation in :mod:`selvedge_django.schedules.definitions`.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

__all__ = ["Schedule", "ScheduleOverlap", "ScheduleQuerySet"]


class ScheduleOverlap(models.TextChoices):
    """What a schedule does with a slot that comes due while its last run still runs."""

    SKIP = "skip", _("Skip the slot")
    BUFFER_ONE = "buffer_one", _("Start one slot when the last run closes")
    ALLOW_ALL = "allow_all", _("Start every slot")
    CANCEL_OTHER = "cancel_other", _("Cancel the last run, then start the newest slot")


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def due(self, now_ms: int) -> ScheduleQuerySet:
        """Unpaused, with a slot due by ``now_ms`` (database clock)."""
        return self.filter(paused=False, next_due_ms__lte=now_ms)

    def buffered(self) -> ScheduleQuerySet:
        """Unpaused, holding a slot back until the last run closes."""
        return self.filter(paused=False, buffered_slot_ms__isnull=False)


class Schedule(models.Model):
    """A durable schedule: the leader starts ``<name>@<slot ISO 8601 UTC>`` for each slot.

    The definition (workflow, cron or interval, timezone, bounds, policies) is
    written by the operations layer only; the bookkeeping (next slot, buffered
    slot, last run, counters) by the leader, in the transaction that starts the
    slot's run. Times of slots are Unix milliseconds on the database clock.
    """

    name = models.CharField(primary_key=True, max_length=200)
    workflow_name = models.CharField(max_length=255)
    input = models.JSONField(null=True, blank=True)
    cron = models.CharField(max_length=255, default="", blank=True)
    interval_ms = models.BigIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    overlap = models.CharField(
        max_length=16, choices=ScheduleOverlap.choices, default=ScheduleOverlap.SKIP
    )
    catchup_window_ms = models.BigIntegerField(default=60_000)
    jitter_ms = models.BigIntegerField(default=0)
    paused = models.BooleanField(default=False)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(
        max_length=16, default="api", help_text=_("api (or the admin), or settings (SCHEDULES)")
    )
    next_slot_ms = models.BigIntegerField(
        null=True, blank=True, help_text=_("the first slot not yet handled (NULL: none left)")
    )
    next_due_ms = models.BigIntegerField(
        null=True, blank=True, help_text=_("when that slot is due: the slot plus its jitter")
    )
    buffered_slot_ms = models.BigIntegerField(
        null=True, blank=True, help_text=_("a slot held back until the last run closes")
    )
    last_run_id = models.CharField(max_length=255, default="", blank=True)
    last_run_ms = models.BigIntegerField(null=True, blank=True)
    recent_runs = models.TextField(default="[]", help_text=_("JSON list of run ids, newest first"))
    runs_started = models.BigIntegerField(default=0)
    missed_runs = models.BigIntegerField(
        default=0, help_text=_("slots skipped because they were older than the catch-up window")
    )
    overlap_skipped_runs = models.BigIntegerField(
        default=0, help_text=_("slots skipped by the overlap policy")
    )
    last_error = models.TextField(default="", blank=True)
    version = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        verbose_name = _("schedule")
        ordering = ("name",)
        permissions = [("trigger_schedule", _("Can trigger schedules"))]
        indexes = [
            models.Index(
                fields=["next_due_ms"],
                name="sv_sched_due_idx",
                condition=Q(paused=False, next_due_ms__isnull=False),
            ),
            models.Index(
                fields=["buffered_slot_ms"],
                name="sv_sched_buffered_idx",
                condition=Q(paused=False, buffered_slot_ms__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.name
