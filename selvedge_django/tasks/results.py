"""``TaskResult`` objects built from the database: the instance and its activity task.

Status: a closed instance is ``SUCCESSFUL`` (completed) or ``FAILED`` (failed,
cancelled or terminated); a running one is ``RUNNING`` while an attempt holds the
task's claim and ``READY`` otherwise (deferred, queued, or waiting to retry).
Errors come from the failures the activity recorded, one per failed attempt, each
with its exception class path, traceback and worker id; ``worker_ids`` lists the
worker of each attempt (never an empty id), so ``attempts`` (its length) counts them
as Django does.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from datetime import datetime
from typing import Any

from ..models import ActivityTaskStatus, WorkflowStatus
from ..operations.task_records import TaskRecord
from . import compat

__all__ = [
    "UnknownTaskError",
    "attempt_errors",
    "build_result",
    "discover_tasks",
    "known_task",
    "load_task",
    "parse_time",
]


def parse_time(text: object) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


class UnknownTaskError(ValueError):
    """A stored task path that names no task this process knows: its module is not
    imported here, or the name there is not a ``Task``. Nothing is imported for it."""


logger = logging.getLogger("selvedge_django.tasks")

# The task modules of this process (discover_tasks): None until they were looked for.
_task_modules: frozenset[str] | None = None
_discover_lock = threading.Lock()


def discover_tasks() -> frozenset[str]:
    """Import, once per process, the modules where the project's tasks are defined:
    each installed app's ``tasks`` module (when it has one) and the modules listed in
    the ``task_modules`` option of each ``SelvedgeBackend`` in ``TASKS``. Returns
    their names.

    A module that fails to import is logged and left out here, so that it does not
    stop the others; its tasks try the import again when they run (:func:`known_task`).
    """
    global _task_modules
    if _task_modules is not None:
        return _task_modules
    with _discover_lock:
        if _task_modules is not None:
            return _task_modules
        from django.apps import apps
        from django.conf import settings
        from django.utils.module_loading import module_has_submodule

        names = [
            f"{config.name}.tasks"
            for config in apps.get_app_configs()
            if module_has_submodule(config.module, "tasks")
        ]
        for config in getattr(settings, "TASKS", {}).values():
            backend = config.get("BACKEND", "") if isinstance(config, dict) else ""
            if backend.startswith("selvedge_django.tasks"):
                names.extend((config.get("OPTIONS") or {}).get("task_modules") or ())
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:
                logger.exception("could not import the task module %s", name)
        _task_modules = frozenset(names)
        return _task_modules


def known_task(path: str) -> compat.Task:
    """The ``Task`` at ``path`` (``module.name``, as ``Task.module_path`` spells it) in a
    module this process has imported: a task module found by :func:`discover_tasks`,
    or any module the process loaded itself (the enqueuing code's). Any other module
    is never imported for a stored path: ``UnknownTaskError``. A task module that
    failed to import is imported again, and its error raised: a deployment error,
    which the retry policy may outlast, not an unknown task."""
    modules = discover_tasks()
    module_name, _, name = str(path).rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    if module is None and module_name in modules:
        module = importlib.import_module(module_name)
    if module is None:
        raise UnknownTaskError(
            f"{path!r} is not a known task: module {module_name!r} is not imported by this"
            " process (define tasks in an app's tasks.py, or list the module in the"
            " backend's OPTIONS['task_modules'])"
        )
    found = getattr(module, name, None)
    if not isinstance(found, compat.Task):
        raise UnknownTaskError(f"Expected {path!r} to point to a Task instance.")
    return found


def load_task(input: dict[str, Any]) -> compat.Task:
    """The enqueued task: the module-level ``Task`` at its path, with the enqueue's changes.

    The path is the one ``Task.module_path`` gave at enqueue; it must name a task this
    process knows (:func:`known_task`): anything else is refused
    (``UnknownTaskError``, a ``ValueError``) without importing anything for it.
    """
    found = known_task(input["task"])
    return found.using(
        priority=int(input.get("priority", found.priority)),
        queue_name=input.get("queue_name") or found.queue_name,
        run_after=parse_time(input.get("run_after")),
        backend=input.get("backend") or found.backend,
    )


def attempt_errors(envelope: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The per-attempt errors a failure envelope carries, oldest first.

    The activity's own failures hold the whole list (``details.task_errors``); a
    timeout or a lapse recorded by the engine becomes one more entry, after the
    errors the task held before it (a lapse keeps them as ``previous_error``), named
    after the worker whose attempt it was (``fields.lost_worker_id``). The error of
    an instance closed from outside (terminated, cancelled) has no worker."""
    if not envelope:
        return []
    details = envelope.get("details")
    if isinstance(details, dict) and isinstance(details.get("task_errors"), list):
        return [entry for entry in details["task_errors"] if isinstance(entry, dict)]
    fields = envelope.get("fields")
    fields = fields if isinstance(fields, dict) else {}
    last = fields.get("last_error")
    if isinstance(last, dict) and last is not envelope:
        inner = attempt_errors(last)
        if inner:
            return inner
    prior = fields.get("previous_error")
    earlier = attempt_errors(prior) if isinstance(prior, dict) and prior is not envelope else []
    kind = envelope.get("type") or "Exception"
    path = kind if "." in kind else f"selvedge_django.exceptions.{kind}"
    if fields.get("application_error"):
        path = kind
    return [
        *earlier,
        {
            "exception_class_path": path,
            "traceback": envelope.get("traceback") or f"{kind}: {envelope.get('message', '')}",
            "worker_id": str(fields.get("lost_worker_id") or ""),
            "started_at": None,
        },
    ]


def build_result(
    task: compat.Task, record: TaskRecord, *, running_worker: str | None = None
) -> compat.TaskResult:
    """The ``TaskResult`` of ``record``; ``running_worker`` marks an attempt in progress."""
    input = record.input if isinstance(record.input, dict) else {}
    errors = attempt_errors(record.last_error)
    if record.status == WorkflowStatus.RUNNING:
        holding = running_worker is not None or record.task_status == ActivityTaskStatus.RUNNING
        status = compat.TaskResultStatus.RUNNING if holding else compat.TaskResultStatus.READY
    elif record.status == WorkflowStatus.COMPLETED:
        status = compat.TaskResultStatus.SUCCESSFUL
    else:
        status = compat.TaskResultStatus.FAILED
        if not errors:
            errors = attempt_errors(record.error)
    # One worker id per attempt: an error with no worker (an operator's terminate or
    # cancel of the instance) was no attempt, and is listed without one.
    worker_ids = [str(entry["worker_id"]) for entry in errors if entry.get("worker_id")]
    current = running_worker or record.claim_owner
    if current and record.task_status in (
        ActivityTaskStatus.RUNNING,
        ActivityTaskStatus.COMPLETED,
    ):
        worker_ids.append(current)
    starts = [parse_time(entry.get("started_at")) for entry in errors]
    started_at = next((s for s in starts if s is not None), record.claim_started_at)
    result = compat.TaskResult(
        task=task,
        id=record.instance_id,
        status=status,
        enqueued_at=record.started_at,
        started_at=started_at,
        finished_at=record.closed_at,
        last_attempted_at=record.claim_started_at or (starts[-1] if starts else None),
        args=input.get("args", []),
        kwargs=input.get("kwargs", {}),
        backend=input.get("backend", task.backend),
        errors=[
            compat.TaskError(
                exception_class_path=str(entry.get("exception_class_path", "")),
                traceback=str(entry.get("traceback", "")),
            )
            for entry in errors
        ],
        worker_ids=worker_ids,
    )
    if status == compat.TaskResultStatus.SUCCESSFUL and record.output is not None:
        import json

        object.__setattr__(result, "_return_value", json.loads(record.output))
    return result
