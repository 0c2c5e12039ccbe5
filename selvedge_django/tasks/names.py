"""The durable names of the built-in task workflow: stored in every task's rows, never changed."""

from __future__ import annotations

__all__ = ["RUN_AFTER_KEY", "TASK_ACTIVITY", "TASK_KEY", "TASK_WORKFLOW"]

TASK_WORKFLOW = "selvedge.task"
TASK_ACTIVITY = "selvedge.task.run"
# The activity id (history key) of the one activity each task instance runs.
TASK_KEY = "task"
# The timer that holds a deferred task until its run_after.
RUN_AFTER_KEY = "run_after"
