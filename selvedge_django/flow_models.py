"""The durable state of flow control: the dispatch and claim order, rate-limited claims.

Imported by :mod:`selvedge_django.models` (its names are re-exported there); see
docs/flow-control.md for the rules.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Func, Q
from django.utils.translation import gettext_lazy as _

__all__ = [
    "AGING_MS_PER_POINT",
    "READY_INDEXES",
    "TASK_FLOW_INDEXES",
    "PriorityRank",
    "QueueClaim",
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


# WorkflowInstance: the ready instances by age (sv_inst_ready_idx: the longest waiting,
# which the status report reads) and by rank, then creation (sv_inst_rank_idx: the order
# dispatch walks, sql.READY_RANK and created_seq).
READY_INDEXES = [
    models.Index(
        fields=["ready_ms", "workflow_name", "code_version"],
        name="sv_inst_ready_idx",
        condition=Q(status="running", runnable=True, lease_owner=""),
    ),
    models.Index(
        PriorityRank("ready_ms", "priority"),
        "created_seq",
        "ready_ms",
        "workflow_name",
        "code_version",
        name="sv_inst_rank_idx",
        condition=Q(status="running", runnable=True, lease_owner=""),
    ),
]
# ActivityTask: the queued tasks by due time (sv_task_queued_idx: the next one due) and by
# rank (sv_task_rank_idx: the order claims walk, sql.TASK_RANK), and the running attempts
# of each concurrency key, which claims count.
TASK_FLOW_INDEXES = [
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
        condition=Q(status="queued"),
    ),
    models.Index(
        fields=["concurrency_key"],
        name="sv_task_running_key_idx",
        condition=Q(status="running") & ~Q(concurrency_key=""),
    ),
]


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
