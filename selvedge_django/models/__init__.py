"""The durable state of workflows, one module per aggregate; every name is re-exported here.

* :mod:`~selvedge_django.models.instances`: an instance and what belongs to it
  (history, archived history, timers, signals).
* :mod:`~selvedge_django.models.tasks`: activity tasks.
* :mod:`~selvedge_django.models.streams`: an instance's streams and their entries.
* :mod:`~selvedge_django.models.schedules`: schedules.
* :mod:`~selvedge_django.models.system`: the leader lock, workers' heartbeats and flow
  control (the priority rank, the claims of rate-limited queues).

Every model belongs to the ``selvedge_django`` app, whichever module defines it.
"""

from __future__ import annotations

from .instances import (
    LONG_HISTORY_SEQ,
    PAUSED_OWNER,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowAttribute,
    WorkflowInstance,
    WorkflowInstanceQuerySet,
    WorkflowStatus,
)
from .schedules import Schedule, ScheduleOverlap, ScheduleQuerySet
from .streams import WorkflowStream, WorkflowStreamEntry
from .system import (
    AGING_MS_PER_POINT,
    ActivityQueue,
    PriorityRank,
    QueueClaim,
    SystemLock,
    WorkerHeartbeat,
)
from .tasks import ActivityTask, ActivityTaskQuerySet, ActivityTaskStatus

__all__ = [
    "AGING_MS_PER_POINT",
    "LONG_HISTORY_SEQ",
    "PAUSED_OWNER",
    "ActivityQueue",
    "ActivityTask",
    "ActivityTaskQuerySet",
    "ActivityTaskStatus",
    "ArchivedHistoryEvent",
    "HistoryEvent",
    "PriorityRank",
    "QueueClaim",
    "Schedule",
    "ScheduleOverlap",
    "ScheduleQuerySet",
    "SignalMessage",
    "SystemLock",
    "TimerSubscription",
    "WorkerHeartbeat",
    "WorkflowAttribute",
    "WorkflowInstance",
    "WorkflowInstanceQuerySet",
    "WorkflowStatus",
    "WorkflowStream",
    "WorkflowStreamEntry",
]
