"""The ``django.tasks`` framework in use: Django's own (6.0+) or the ``django-tasks`` backport.

Both spell the same API; the backport names one exception differently. Importing
this module raises ``ImportError`` with a hint when neither is installed. The names
are loaded with ``importlib`` and typed ``Any``: which framework answers depends on
the installed Django, and the type checker sees one of them at most.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = [
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _modules() -> tuple[str, dict[str, ModuleType], str]:
    for root, json_module, invalid in (
        ("django.tasks", "django.utils.json", "InvalidTask"),  # Django 6.0 and newer
        ("django_tasks", "django_tasks.utils", "InvalidTaskError"),  # the backport
    ):
        try:
            found = {
                name: importlib.import_module(f"{root}{suffix}")
                for name, suffix in (
                    ("root", ""),
                    ("base", ".base"),
                    ("backends", ".backends.base"),
                    ("exceptions", ".exceptions"),
                    ("signals", ".signals"),
                )
            }
        except ImportError:
            continue
        found["json"] = importlib.import_module(json_module)
        return root, found, invalid
    raise ImportError(
        "selvedge_django.tasks needs django.tasks (Django 6.0 or newer) or, on Django 5.2,"
        " the django-tasks backport (pip install django-tasks)"
    )


FRAMEWORK, _found, _invalid = _modules()

BaseTaskBackend: Any = _found["backends"].BaseTaskBackend
InvalidTask: Any = getattr(_found["exceptions"], _invalid)
Task: Any = _found["base"].Task
TaskContext: Any = _found["base"].TaskContext
TaskError: Any = _found["base"].TaskError
TaskResult: Any = _found["base"].TaskResult
TaskResultDoesNotExist: Any = _found["exceptions"].TaskResultDoesNotExist
TaskResultStatus: Any = _found["base"].TaskResultStatus
normalize_json: Any = _found["json"].normalize_json
task_backends: Any = _found["root"].task_backends
task_enqueued: Any = _found["signals"].task_enqueued
task_finished: Any = _found["signals"].task_finished
task_started: Any = _found["signals"].task_started
