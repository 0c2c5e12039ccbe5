"""One attempt of an enqueued task, inside the ``selvedge.task.run`` activity.

The attempt reads its instance and task rows once (its worker id and the errors of
the attempts before it), sends ``task_started`` and calls the task
(``task_finished`` follows the commit of the outcome: ``tasks.finished``). A failure
(any ``BaseException`` the task raises, ``SystemExit`` and ``KeyboardInterrupt`` too) raises
:class:`~selvedge_django.ApplicationError` whose details hold every attempt's
error so far, which the engine records on the task row before the retry.
"""

from __future__ import annotations

import traceback as tb
from datetime import datetime
from typing import Any

from django.utils import timezone

from ..engine.activity import activity_info
from ..exceptions import ApplicationError, Cancelled
from ..operations.task_records import task_record
from . import compat
from .names import TASK_KEY
from .results import UnknownTaskError, attempt_errors, build_result, load_task

__all__ = ["run_attempt"]

# The end of a traceback that an attempt's error keeps (the envelope's bound).
MAX_TRACEBACK = 8000


def _class_path(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def _non_retryable(task: compat.Task) -> tuple[type[BaseException], ...]:
    """The error classes that end the task at once: the task's policy, else the backend's."""
    from .options import retry_policy_for

    policy = retry_policy_for(task)
    return policy.non_retryable_errors if policy is not None else ()


def run_attempt(input: dict[str, Any]) -> Any:
    """Run the task once and return its JSON-normalised value (or raise its failure)."""
    info = activity_info()
    if info is None:  # called directly, outside a worker (a unit test of the task)
        return load_task(input).call(*input.get("args", []), **input.get("kwargs", {}))
    record = task_record(info.instance_id, TASK_KEY)
    worker_id = record.claim_owner
    previous = attempt_errors(record.last_error) if record.failures else []
    started = timezone.now()
    try:
        task = load_task(input)
    except UnknownTaskError as error:
        # Not a task this worker knows: nothing imported for it, and no retry can
        # make it one (a deploy that adds it runs the tasks enqueued after).
        raise _failure(error, previous, worker_id, started, non_retryable=True) from error
    result = build_result(task, record, running_worker=worker_id)
    # The sender is the task's backend class (SelvedgeBackend, or a subclass of it).
    compat.task_started.send(sender=type(task.get_backend()), task_result=result)
    args, kwargs = input.get("args", []), input.get("kwargs", {})
    try:
        if task.takes_context:
            value = task.call(compat.TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = compat.normalize_json(value)
    except Cancelled:
        raise  # the engine's own cancellation, not the task's failure
    except BaseException as error:
        # Any exception of the task's, SystemExit and KeyboardInterrupt included (as in
        # Django's reference backend), is its failure: recorded with its class path,
        # traceback and worker, under the retry policy. The worker keeps running.
        non_retryable = isinstance(error, _non_retryable(task))
        raise _failure(error, previous, worker_id, started, non_retryable) from error
    return value


def _failure(
    error: BaseException,
    previous: list[dict[str, Any]],
    worker_id: str,
    started: datetime,
    non_retryable: bool,
) -> ApplicationError:
    """The attempt's failure: its error after those of the attempts before it."""
    path = _class_path(error)
    entry = {
        "exception_class_path": path,
        "traceback": "".join(tb.format_exception(error))[-MAX_TRACEBACK:],
        "worker_id": worker_id,
        "started_at": started.isoformat(),
    }
    return ApplicationError(
        str(error) or path,
        type=path,
        details={"task_errors": [*previous, entry]},
        non_retryable=non_retryable,
    )
