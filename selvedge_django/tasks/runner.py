"""The built-in workflow that runs one enqueued ``django.tasks`` task as one activity.

``selvedge.task`` (the workflow) waits for ``run_after`` on a durable timer when the
task was deferred, then executes ``selvedge.task.run`` (the activity) under the
options recorded at enqueue: the queue, the retry policy, the start-to-close
timeout and the priority. The activity imports the task by its module path, runs
it, and sends ``task_started`` and ``task_finished``. Its output is the task's
return value; its failures carry every attempt's error (class path, traceback,
worker id) so that ``get_result`` reads them back without replay.

This module imports nothing of ``django.tasks`` (the activity does, when it runs),
so workers load it on every Django line: ``selvedge_django.workflows`` imports it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..engine.context import WorkflowContext
from ..engine.options import ActivityOptions
from ..operations.instances import start_at, start_with_activity
from ..registry import activity, workflow
from .names import RUN_AFTER_KEY, TASK_ACTIVITY, TASK_KEY, TASK_WORKFLOW

__all__ = ["run_task", "run_task_activity", "start_task"]


@activity(name=TASK_ACTIVITY)
def run_task_activity(input: dict[str, Any]) -> Any:
    """Run the task named in ``input`` once (one attempt); see ``tasks.execute``."""
    from .execute import run_attempt

    return run_attempt(input)


def start_task(
    input: dict[str, Any],
    *,
    instance_id: str,
    priority: int,
    enqueued_at: datetime | None = None,
) -> None:
    """Start the instance of an enqueued task: a task due now with its activity
    reserved (what the workflow's first execution would record), a deferred one as a
    plain start that waits for ``run_after`` first. ``enqueued_at`` is recorded as
    the instance's start (default: now)."""
    if int(input.get("delay_ms") or 0) > 0:
        start_at(
            run_task, input, instance_id=instance_id, priority=priority, started_at=enqueued_at
        )
        return
    options = ActivityOptions.from_json(input.get("options") or {})
    start_with_activity(
        run_task,
        input,
        run_task_activity,
        options,
        instance_id=instance_id,
        priority=priority,
        started_at=enqueued_at,
    )


@workflow(name=TASK_WORKFLOW)
def run_task(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """Wait for ``run_after`` if the task was deferred, then run it as one activity."""
    delay_ms = int(input.get("delay_ms") or 0)
    if delay_ms > 0:
        ctx.sleep(timedelta(milliseconds=delay_ms), sleep_id=RUN_AFTER_KEY)
    options = ActivityOptions.from_json(input.get("options") or {})
    return run_task_activity.execute(ctx, input, options=options, activity_id=TASK_KEY)


# A task due now is enqueued with its activity already reserved (start_with_activity),
# and the attempt that succeeds closes the instance: two commits a task.
run_task.result_activity = TASK_KEY
