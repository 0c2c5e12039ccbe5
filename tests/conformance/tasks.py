"""The tasks django-tasks-db's test suite enqueues, by the names it uses.

Its own ``tests/tasks.py`` is not in the source distribution; these behave as the
suite's assertions describe (a value, an exception, a sleep, the context).
"""

from __future__ import annotations

import time
from typing import Any

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    return {"not": {"json"}}  # a set: not JSON serializable


@task()
def exit_task() -> None:
    exit(1)


@task()
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@task()
def hang() -> None:
    """Sleeps far longer than any test waits."""
    time.sleep(3600)


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return str(context.task_result.id)


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    assert context.task_result.attempts == attempt
