"""The bounded reads behind the metrics' gauges (queue depths, the oldest waiting).

Each read walks a partial index in its order and stops after ``cap`` rows, so one
observation costs the same whatever the backlog: a count at the cap means "at
least that many". The leader's process runs them, at most once per collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Case, Count, Min, Subquery, When
from django.utils import timezone

from ..metrics import GaugeReading
from ..models import ActivityTask, ActivityTaskStatus

if TYPE_CHECKING:
    from .store import Store

__all__ = ["GAUGE_CAP", "read_gauges"]

# Rows one observation reads at most, per read.
GAUGE_CAP = 10_000


def read_gauges(store: Store, cap: int = GAUGE_CAP) -> GaugeReading:
    """Queued and running tasks per queue, the oldest due, and the runnable instances."""
    tasks = ActivityTask.objects.using(store.alias)
    now_ms = store.now_ms()
    wall = timezone.now()
    queued_ids = (
        tasks.filter(status=ActivityTaskStatus.QUEUED)
        .order_by("not_before_ms", "id")
        .values("id")[:cap]
    )
    queued: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for row in (
        tasks.filter(id__in=Subquery(queued_ids))
        .values("queue")
        .annotate(
            n=Count("id"),
            # A retry is due from the end of its backoff, a first attempt from its creation.
            due_ms=Min(Case(When(not_before_ms__gt=0, then="not_before_ms"))),
            created=Min(Case(When(not_before_ms=0, then="created_at"))),
        )
        .order_by()
    ):
        queue = str(row["queue"])
        queued[queue] = int(row["n"])
        ages = [0.0]
        if row["due_ms"] is not None:
            ages.append((now_ms - int(row["due_ms"])) / 1000)
        if row["created"] is not None:
            ages.append((wall - row["created"]).total_seconds())
        oldest[queue] = max(ages)
    running_ids = tasks.filter(status=ActivityTaskStatus.RUNNING).values("id")[:cap]
    running = {
        str(row["queue"]): int(row["n"])
        for row in tasks.filter(id__in=Subquery(running_ids))
        .values("queue")
        .annotate(n=Count("id"))
        .order_by()
    }
    # The status report's reads: the partial ready index, insisted on where SQLite would
    # rather sort every running instance.
    runnable = store.status.count_runnable(now_ms, cap)
    first = store.status.runnable_instances(now_ms, 1)
    return GaugeReading(
        queued=queued,
        oldest_queued_age_s=oldest,
        running=running,
        runnable_instances=runnable,
        oldest_runnable_age_s=max(0.0, (now_ms - first[0].ready_ms) / 1000) if first else 0.0,
    )
