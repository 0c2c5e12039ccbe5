"""The rows of the system itself: the leader lock, workers' heartbeats, flow control.

Flow control (see docs/flow-control.md): ``PriorityRank``, the order that dispatch
and claims walk, indexed on instances and tasks; ``QueueClaim``, the claims of
rate-limited queues; ``ActivityQueue``, the activity queues an operator paused.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Func
from django.utils.translation import gettext_lazy as _

__all__ = [
    "AGING_MS_PER_POINT",
    "ActivityQueue",
    "PriorityRank",
    "QueueClaim",
    "SystemLock",
    "WorkerHeartbeat",
]


# Aging: waiting this long (ms) is worth one priority point, so nothing waits forever.
AGING_MS_PER_POINT = 60_000


class PriorityRank(Func):
    """``(ready - 60000 * priority)``, smallest first: a priority point is worth a minute
    of waiting (``AGING_MS_PER_POINT``). Indexed; ``sql.READY_RANK`` and ``sql.TASK_RANK``
    spell it alike, so the store's statements walk those indexes."""

    template = "(%(expressions)s)"
    arg_joiner = f" - {AGING_MS_PER_POINT} * "
    output_field = models.BigIntegerField()


class SystemLock(models.Model):
    """A named lock with a lease, for leader election and maintenance duties."""

    name = models.CharField(primary_key=True, max_length=255)
    owner = models.CharField(max_length=255, default="", blank=True)
    epoch = models.BigIntegerField(default=0)
    expires_ms = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = _("system lock")

    def __str__(self) -> str:
        return self.name


class WorkerHeartbeat(models.Model):
    """A running worker: who it is and when it last said so (database clock, Unix ms).

    Each worker writes its row when it starts and every ``LEADER_HEARTBEAT_INTERVAL``
    after, with an expiry ``LEADER_LEASE_DURATION`` later; a graceful stop deletes
    it. A row whose expiry passed is a worker that stopped without saying so (killed,
    or cut off from the database); the leader deletes such rows after a day.
    """

    worker_id = models.CharField(primary_key=True, max_length=255)
    hostname = models.CharField(max_length=255, default="", blank=True)
    pid = models.IntegerField(default=0)
    service_name = models.CharField(max_length=255, default="", blank=True)
    code_version = models.CharField(max_length=255, null=True, blank=True)
    queues = models.JSONField(
        null=True, blank=True, help_text="the activity queues it serves (NULL: all)"
    )
    started_ms = models.BigIntegerField()
    last_seen_ms = models.BigIntegerField()
    expires_ms = models.BigIntegerField()
    undecodable = models.JSONField(
        null=True,
        blank=True,
        help_text="instances it cannot decode and leaves for a worker with the key"
        " (instance_id, key_id; the latest 50)",
    )

    class Meta:
        verbose_name = _("worker heartbeat")
        ordering = ("worker_id",)
        indexes = [models.Index(fields=["expires_ms"], name="sv_worker_expires_idx")]

    def __str__(self) -> str:
        return self.worker_id


class QueueClaim(models.Model):
    """One claim of a task in a rate-limited queue (``SELVEDGE["QUEUE_RATE_LIMITS"]``).

    Claims of such a queue count the rows of its sliding window (the last period)
    and write one per task they take, in the claim's transaction; rows that left
    the window are deleted by the next claim of the queue.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=255)
    claimed_ms = models.BigIntegerField(help_text="database clock, Unix ms")

    class Meta:
        verbose_name = _("queue claim")
        indexes = [models.Index(fields=["queue", "claimed_ms"], name="sv_queue_claim_idx")]

    def __str__(self) -> str:
        return f"{self.queue} @ {self.claimed_ms}"


class ActivityQueue(models.Model):
    """An activity queue an operator paused or unpaused (``sv.pause_queue``).

    A queue without a row was never paused. While ``paused``, no claim takes its
    tasks, neither an activity worker's nor an inline one; they stay queued.
    """

    name = models.CharField(primary_key=True, max_length=255, blank=True)
    paused = models.BooleanField(default=False)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = _("activity queue")
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name or "(default)"
