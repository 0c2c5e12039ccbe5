"""The columns of activity task rows: a new row's, shared by every writer that creates one,
and what a claim derives from a row it took."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engine.events import Fence, HistoryRow
from ..engine.ports import TaskSpec

if TYPE_CHECKING:
    from ..models import ActivityTask

__all__ = ["task_fields", "waited_ms"]


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def task_fields(fence: Fence, row: HistoryRow, task: TaskSpec, now: Any) -> dict[str, Any]:
    """The columns of a new task row for ``task``, reserved at ``row`` under ``fence``;
    ``now`` (the database clock) is its ready time, from which its wait is counted."""
    key, limit = task.concurrency or ("", None)
    return dict(
        instance_id=fence.instance_id,
        workflow_name=task.workflow_name,
        key=row.key,
        seq=row.seq or 0,
        name=task.name,
        input=task.input,
        queue=task.queue,
        options=task.options,
        max_attempts=task.max_attempts,
        schedule_to_start_ms=_ms(task.schedule_to_start_timeout),
        start_to_close_ms=_ms(task.start_to_close_timeout),
        heartbeat_timeout_ms=_ms(task.heartbeat_timeout),
        not_before_ms=now,
        priority=task.priority,
        concurrency_key=key,
        max_concurrency=limit,
    )


def waited_ms(task: ActivityTask, started_ms: int | None) -> int | None:
    """How long a task was due before the claim that began at ``started_ms``.

    Due since ``not_before_ms`` (a retry's backoff end), or since its creation.
    """
    if started_ms is None:
        return None
    due_ms = task.not_before_ms or (
        int(task.created_at.timestamp() * 1000) if task.created_at is not None else None
    )
    return None if due_ms is None else max(0, int(started_ms) - due_ms)
